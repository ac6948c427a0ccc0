"""Slides given to `embed` instead of stores: converted on the way in, one slide ahead, with
the same features as the four commands (convert, tissue, plan, embed) run one by one."""

from __future__ import annotations

import io
import json
import os
import signal
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import tifffile
import zarr

from tests.conftest import CMU, NDPI, group_of, run_cli, store_tree
from tilestore.conversion.converter import convert
from tilestore.embed import inputs
from tilestore.embed.engine import embed
from tilestore.embed.inputs import Preparation, Stager
from tilestore.embed.settings import Options
from tilestore.errors import OptionError, SlideError, StoreError
from tilestore.format.store import one_store_each
from tilestore.masks.tissue import compute_tissue, read_tissue
from tilestore.plan import PlanOptions
from tilestore.reading.opening import open_slide

LITE = "efficientnet-lite0"
FP32 = Options(batch_size=8, device="cpu", precision="fp32", dtype="float32")
PLAN = PlanOptions(mpp=1.0, tile=224)


def _features(store):
    return zarr.open_group(store / group_of(store, LITE), mode="r")["features"][:]


def test_a_slide_given_equals_the_four_commands(slide_path, tmp_path, lite):
    svs = slide_path(CMU)
    report = embed([svs], lite, plan=PLAN, options=FP32, convert_into=tmp_path / "in")
    assert not report.failures
    (done,) = report.converted
    (prepared,) = report.prepared
    assert prepared["slide"] == str(svs) and set(prepared["seconds"]) == {"store", "tissue"}
    assert done["levels"] == ["copy", "re-encode"] and done["codec"] == "jpeg"
    made = tmp_path / "in" / "CMU-1-Small-Region.ome.zarr"
    assert report.slides[0]["store"] == str(made)
    by_hand = convert(svs, tmp_path / "by-hand").store
    embed([by_hand], lite, plan=PLAN, options=FP32)
    np.testing.assert_array_equal(_features(made), _features(by_hand))  # bitwise, fp32 CPU
    # again: the store there is the slide's: reused, not converted; the embedding is done
    again = embed([svs], lite, plan=PLAN, options=FP32, convert_into=tmp_path / "in")
    assert again.converted == [{"slide": str(svs), "store": str(made), "reused": True}]
    assert "is already complete" in again.skipped[0]["why"]


def test_a_store_of_another_slide_is_not_taken_for_it(slide_path, tmp_path, lite, store):
    into = tmp_path / "in"
    impostor = store(NDPI, into=into)  # the DAPI slide's store, under the SVS's store name
    impostor.rename(into / "CMU-1-Small-Region.ome.zarr")
    bad = tmp_path / "bad.svs"
    bad.write_bytes(slide_path(CMU).read_bytes()[:50_000])  # cut: a truncated slide
    report = embed(
        [slide_path(CMU), bad, store()], lite, plan=PLAN, options=FP32, convert_into=into
    )
    first, second = report.failures
    assert first["store"] == str(slide_path(CMU))
    assert "already holds another slide (stritt_test3-DAPI-2-387.ndpi" in first["error"]
    assert second["store"] == str(bad) and "truncated" in second["error"]
    assert not (into / "bad.ome.zarr").exists()  # nothing that looks valid is left
    assert len(report.slides) == 1  # the store given as a store is embedded


def test_a_store_is_reused_only_for_the_very_slide_it_was_made_from(slide_path, tmp_path):
    """The same file, or a copy (another time, the same bytes): reused once its SHA-256 is
    the one recorded. Another file of the same name, size and time (one byte of a tile
    changed, the time put back as `cp -p`, `rsync -t` or `tar` keep it): refused in one
    line, the store kept as it was; so is one of another size."""
    svs = tmp_path / "CMU-1-Small-Region.svs"
    svs.write_bytes(slide_path(CMU).read_bytes())
    into = tmp_path / "in"
    store, converted, _ = inputs.prepare(svs, into, None, True)
    assert "seconds" in converted  # made
    reused = {"slide": str(svs), "store": str(store), "reused": True}
    assert inputs.prepare(svs, into, None, True)[1] == reused
    stat = svs.stat()
    os.utime(svs, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # copied: a new time
    assert inputs.prepare(svs, into, None, True)[1] == reused
    with tifffile.TiffFile(svs) as tif:
        inside = tif.pages[0].dataoffsets[0] + 200  # within level 0's first tile
    data = bytearray(svs.read_bytes())
    data[inside] ^= 0xFF
    svs.write_bytes(data)
    os.utime(svs, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the time recorded: cp -p
    before = open_slide(store).record
    assert (before.source.size, before.source.mtime_ns) == (len(data), stat.st_mtime_ns)
    with pytest.raises(StoreError) as refused:
        inputs.prepare(svs, into, None, True)
    assert str(refused.value) == (
        f"{store}: made from another file of the same name and size (CMU-1-Small-Region.svs, "
        f"{len(data)} bytes) whose SHA-256 differs from {svs}'s (its bytes changed, whatever "
        "its time says); move it or choose another --into folder"
    )
    assert open_slide(store).record == before  # kept, complete, untouched
    svs.write_bytes(bytes(data) + b"\0" * 10)  # another size
    with pytest.raises(StoreError) as refused:
        inputs.prepare(svs, into, None, True)
    assert str(refused.value) == (
        f"{store}: made from another file of this name ({len(data)} bytes; {svs}: "
        f"{len(data) + 10}); move it or choose another --into folder"
    )


def test_a_store_made_before_the_slides_hash_was_recorded_is_not_said_to_differ(
    slide_path, tmp_path
):
    """Such a store cannot be told to be the slide's: refused, saying none was recorded and
    what to do (give the store itself, or remove it), not that a hash "differs"."""
    svs = tmp_path / "CMU-1-Small-Region.svs"
    svs.write_bytes(slide_path(CMU).read_bytes())
    into = tmp_path / "in"
    store, _, _ = inputs.prepare(svs, into, None, True)
    root = zarr.open_group(store, mode="r+")
    attrs = root.attrs["tilestore"]
    del attrs["source"]["sha256"]  # as a store made before it was recorded
    root.attrs["tilestore"] = attrs
    assert open_slide(store).record.source.sha256 is None
    with pytest.raises(StoreError) as refused:
        inputs.prepare(svs, into, None, True)
    assert str(refused.value) == (
        f"{store}: made before tilestore recorded a slide's SHA-256, so whether it was made "
        f"from {svs} cannot be told; give the store itself instead of the slide if it is that "
        "slide's, else remove it to convert the slide again"
    )


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_something_not_a_store_where_the_store_goes_is_named_and_kept(slide_path, tmp_path, kind):
    """A file (or a folder) that is not a store at the store's path: moved, never "pass
    --overwrite" (which then failed the same way)."""
    into = tmp_path / "in"
    into.mkdir()
    there = into / "CMU-1-Small-Region.ome.zarr"
    if kind == "file":
        there.write_text("notes")
    else:
        there.mkdir()
        (there / "notes.txt").write_text("notes")
    with pytest.raises(StoreError) as refused:
        inputs.prepare(slide_path(CMU), into, None, True)
    assert str(refused.value) == (
        f"{there}: a {kind} that is not a tilestore store is where CMU-1-Small-Region.svs's "
        "store goes; move it or choose another --into folder"
    )
    assert "overwrite" not in str(refused.value)
    assert sorted(p.name for p in into.iterdir()) == [there.name]  # nothing else made


def _copies(slide_path, tmp_path, *names):
    """Links to the real SVS under other names: slides the worker converts for real."""
    paths = []
    for name in names:
        (tmp_path / name).symlink_to(slide_path(CMU))
        paths.append(tmp_path / name)
    return paths


def _appears(path, seconds=120.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.05)
    return False


def test_the_first_slide_converts_before_it_is_asked_for_and_one_slide_ahead(
    slide_path, tmp_path, monkeypatch
):
    paths = _copies(slide_path, tmp_path, "a.svs", "b.svs", "c.svs")
    into = tmp_path / "in"
    sent = []  # the slides asked of the worker, in order: what "ahead" means, without waiting
    send = inputs.SlideWorker.send
    monkeypatch.setattr(
        inputs.SlideWorker,
        "send",
        lambda self, request: sent.append(Path(request["slide"]).name) or send(self, request),
    )
    stager = Stager(paths, into)
    assert sent == ["a.svs", "b.svs"]  # the first, and one ahead, before anything is asked
    # nothing asked yet: the worker converts a (and then b) while the caller imports torch
    assert _appears(into / "a.ome.zarr" / "zarr.json")
    items = iter(stager)
    first = next(items)
    assert first.given == paths[0] and first.store == into / "a.ome.zarr"
    assert first.converted["levels"] == ["copy", "re-encode"]
    assert "tissue mask computed" in first.converted["tissue"]  # the default plan reads one
    # what each step took, for the run's report ("prepared ... beside the run")
    assert set(first.seconds) == {"store", "tissue"} and all(first.seconds.values())
    assert _appears(into / "b.ome.zarr" / "zarr.json")  # b while a is used
    assert sent == ["a.svs", "b.svs"]  # c waits until b is asked for
    assert not (into / "c.ome.zarr").exists()  # so the worker, done with b, has not begun it
    second = next(items)
    assert second.store.name == "b.ome.zarr" and sent == ["a.svs", "b.svs", "c.svs"]
    assert [s.store.name for s in items] == ["c.ome.zarr"]
    assert stager._workers == [None]  # closed when the inputs ran out


def test_the_mask_made_ahead_is_the_one_the_plan_reads(slide_path, tmp_path):
    (svs,) = _copies(slide_path, tmp_path, "a.svs")
    (staged,) = Stager([svs], tmp_path / "in", PlanOptions(min_tissue=0))
    assert "tissue" not in staged.converted  # a plan of every tile reads no mask
    assert set(staged.seconds) == {"store"}
    assert read_tissue(open_slide(staged.store)) is None
    (staged,) = Stager([svs], tmp_path / "in", PLAN)  # reused, now with its mask
    assert staged.converted["reused"]
    stored = read_tissue(open_slide(staged.store))
    assert stored is not None
    np.testing.assert_array_equal(stored.mask, compute_tissue(open_slide(staged.store)).mask)
    (staged,) = Stager([svs], tmp_path / "in", "a-stored-plan")  # a name: no mask wanted
    assert staged.error is None


def test_a_slide_read_in_place_gets_its_sidecar_and_mask_in_the_worker(slide_path, tmp_path):
    (svs,) = _copies(slide_path, tmp_path, "a.svs")
    (staged,) = Stager([svs], None, in_place=True)
    assert staged.store == tmp_path / "a.svs.tilestore.zarr" and staged.converted is None
    assert set(staged.seconds) == {"store", "tissue"}  # its sidecar made, its mask computed
    assert read_tissue(open_slide(staged.store)) is not None  # stored in the sidecar beside it


def test_sidecars_go_where_asked_and_a_slide_with_nowhere_to_go_is_refused(slide_path, tmp_path):
    (svs,) = _copies(slide_path, tmp_path, "a.svs")
    (staged,) = Stager([svs], None, in_place=True, sidecars=tmp_path / "side")
    assert staged.error is None and staged.store == tmp_path / "side" / "a.svs.tilestore.zarr"
    assert not list(tmp_path.glob("a.svs.tilestore*"))  # nothing beside the slide
    (refused,) = Stager([svs], None)  # neither converted nor read in place: not a store
    assert refused.store == svs and refused.error is None  # the engine refuses it by name


def test_a_worker_that_dies_fails_its_slide_and_a_new_one_takes_the_next(slide_path, tmp_path):
    paths = _copies(slide_path, tmp_path, "a.svs", "b.svs")
    into = tmp_path / "in"
    stager = Stager(paths, into)
    os.kill(stager._workers[0]._proc.pid, signal.SIGKILL)  # still importing: a is not done
    first, second = list(stager)
    assert first.store is None and isinstance(first.error, SlideError)
    assert str(first.error) == (
        f"{paths[0]}: the process preparing it died (killed by signal 9): a damaged or "
        "unsupported file?"
    )
    assert second.error is None and second.store == into / "b.ome.zarr"
    assert not (into / "a.ome.zarr").exists()  # nothing that looks valid is left of a


@pytest.mark.slow
def test_slides_made_ready_at_once_come_in_order_as_the_stores_made_one_at_a_time(
    slide_path, tmp_path, monkeypatch
):
    """Three workers: each slide goes to the one with the fewest in hand, the outcomes
    come in the order given, a damaged slide fails with its own cause, and every store
    (its tissue mask too) is the one a single worker makes, bit for bit."""
    names = ["a.svs", "b.svs", "c.svs", "d.svs", "e.svs"]
    paths = _copies(slide_path, tmp_path, *names)
    damaged = tmp_path / "cut.svs"
    damaged.write_bytes(slide_path(CMU).read_bytes()[:50_000])
    paths.insert(2, damaged)
    asked = []  # (slide, the worker's pid)
    send = inputs.SlideWorker.send
    monkeypatch.setattr(
        inputs.SlideWorker,
        "send",
        lambda self, request: (
            asked.append((Path(request["slide"]).name, self._proc.pid)) or send(self, request)
        ),
    )
    stager = Stager(paths, tmp_path / "many", at_once=3)
    assert len({pid for _, pid in asked}) == 3  # the first three, each to a worker
    many = list(stager)
    assert [s.given for s in many] == paths
    made_from = [(s.given.stem, s.store.name) for s in many if s.store is not None]
    assert made_from == [(p.stem, f"{p.stem}.ome.zarr") for p in paths if p != damaged]
    assert sorted(Counter(pid for _, pid in asked).values()) == [2, 2, 2]  # two each
    assert isinstance(many[2].error, SlideError) and many[2].store is None
    assert str(many[2].error).startswith(f"{damaged}: truncated or corrupt")
    assert all(s.error is None for i, s in enumerate(many) if i != 2)
    assert len({pid for _, pid in asked}) == 3 and len(asked) == len(paths)
    alone = list(Stager(paths, tmp_path / "alone"))
    assert [s.error is None for s in alone] == [s.error is None for s in many]
    made = store_tree(tmp_path / "many")
    assert made == store_tree(tmp_path / "alone") and len(made) > 20
    assert not any(key.startswith("cut") for key in made)  # nothing left that looks valid


def test_a_worker_stopped_by_a_signal_says_so_not_that_the_slide_is_damaged(slide_path, tmp_path):
    """SLURM's SIGTERM reaches every process of a job: the slide being made ready is not
    blamed for it (the run itself stops on the same signal)."""
    (path,) = _copies(slide_path, tmp_path, "a.svs")
    stager = Stager([path], tmp_path / "in")
    os.kill(stager._workers[0]._proc.pid, signal.SIGTERM)
    (staged,) = list(stager)
    assert str(staged.error) == (
        f"{path}: the process preparing it was stopped (SIGTERM) before it was ready: the "
        "same command makes it ready again"
    )


def test_a_worker_of_several_that_dies_fails_its_slide_and_its_next_go_to_a_new_one(
    slide_path, tmp_path
):
    paths = _copies(slide_path, tmp_path, "a.svs", "b.svs", "c.svs", "d.svs")
    into = tmp_path / "in"
    stager = Stager(paths, into, PlanOptions(min_tissue=0), at_once=2)
    # asked so far: a and c of the first worker, b of the second (one ahead of two)
    os.kill(stager._workers[0]._proc.pid, signal.SIGKILL)  # still importing: a is not done
    outcomes = list(stager)
    assert [s.given for s in outcomes] == paths
    assert "the process preparing it died (killed by signal 9)" in str(outcomes[0].error)
    assert [s.store for s in outcomes[1:]] == [into / f"{n}.ome.zarr" for n in "bcd"]
    assert stager._workers == [None, None]


def test_slides_at_once_on_dask_are_refused_at_the_door(tmp_path):
    done = run_cli("embed", tmp_path / "a.ome.zarr", "--model", "efficientnet-lite0",
                   "--at-once", "4", "--scheduler", "tcp://127.0.0.1:1")  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        "tilestore: error: --at-once 4: on Dask each worker makes its own slides ready, one "
        "at a time: add workers instead"
    )


def test_damaged_slides_read_in_place_fail_in_the_worker_with_their_cause(slide_path, tmp_path):
    cut = tmp_path / "cut.svs"
    cut.write_bytes(slide_path(CMU).read_bytes()[:50_000])  # a truncated real SVS
    text = tmp_path / "text.svs"
    text.write_text("not a slide")
    (good,) = _copies(slide_path, tmp_path, "good.svs")
    first, second, third = Stager([cut, text, good], None, in_place=True)
    assert isinstance(first.error, SlideError) and first.store is None
    assert str(first.error).startswith(f"{cut}: truncated or corrupt")
    assert isinstance(second.error, SlideError)
    assert str(second.error).startswith(f"{text}: not a supported slide")
    assert third.error is None and third.store == tmp_path / "good.svs.tilestore.zarr"
    assert not list(tmp_path.glob("cut.svs.tilestore*"))  # nothing that looks valid


def test_the_worker_answers_errors_by_kind_and_bugs_with_their_traceback(monkeypatch):
    def prepare(slide, into, tissue, only_plan_will_do, sidecars=None, scan_mpp=None, cpus=None,
                override_mpp=False):  # fmt: skip
        if slide.name == "bad.svs":
            raise StoreError(f"{slide}: cannot write store: disk full")
        raise ValueError("a bug")

    monkeypatch.setattr(inputs, "prepare", prepare)
    requests = "".join(
        json.dumps({"slide": name, "into": "in", "tissue": None, "only_plan_will_do": True}) + "\n"
        for name in ("bad.svs", "other.svs")
    )
    replies = io.StringIO()
    inputs._serve(io.StringIO(requests), replies)
    error, bug = map(json.loads, replies.getvalue().splitlines())
    assert error == {"error": ["StoreError", "bad.svs: cannot write store: disk full"]}
    assert "ValueError: a bug" in bug["bug"]

    class Answers:  # a worker whose replies are these
        def __init__(self, *replies):
            self.replies = list(replies)

        def receive(self):
            return self.replies.pop(0)

    stager = Stager([], "in")
    stager._workers = [Answers(error, bug)]
    staged = stager._reply(Path("bad.svs"), 0)
    assert type(staged.error) is StoreError and staged.store is None  # its kind kept
    with pytest.raises(RuntimeError, match="ValueError: a bug"):  # a bug is not a user error
        stager._reply(Path("other.svs"), 0)
    stager._workers = [None]


def test_a_run_stopped_early_stops_the_worker(slide_path, tmp_path):
    paths = _copies(slide_path, tmp_path, "a.svs", "b.svs")
    stager = Stager(paths, tmp_path / "in")
    proc = stager._workers[0]._proc
    stager.close()  # a and b sent, neither answered: the worker is stopped, not waited for
    assert proc.poll() is not None
    assert not (tmp_path / "in" / "b.ome.zarr").exists()


def test_a_conversion_asked_for_a_share_of_the_cpus_gets_it(monkeypatch, tmp_path, slide_path):
    """A Dask worker's slide process converts with its worker's CPUs (`Preparation.cpus`),
    not the whole machine's."""
    from tilestore.conversion import converter

    asked = {}

    def convert(src, dst, **kwargs):
        asked.update(kwargs)
        raise StoreError(f"{dst}: stopped here")

    monkeypatch.setattr(converter, "convert", convert)
    how = inputs.Preparation.of(tmp_path, None, cpus=3)
    reply = json.loads(inputs._answer(how.request(slide_path(CMU))))
    assert reply["error"][0] == "StoreError" and asked["workers"] == 3


def test_an_input_given_again_is_taken_once_and_two_bound_for_one_store_are_refused(
    slide_path, tmp_path
):
    """A store given again (by one path, through `..` or a link) is taken once, as on Dask:
    the second would find its own run's lock. Two slides of one name from two folders
    converted into one: refused in one line, exit 2, before anything is made."""
    store = tmp_path / "a.ome.zarr"
    assert convert(slide_path(CMU), tmp_path, name="a").store == store
    (tmp_path / "x").mkdir()  # `x/..` is the folder itself
    (tmp_path / "link.ome.zarr").symlink_to(store)
    how = Preparation.of(None, None)
    for other in (store, tmp_path / "x" / ".." / "a.ome.zarr", tmp_path / "link.ome.zarr"):
        assert how.once_each([store, other, store]) == [store]
    for folder in ("x", "y"):
        (tmp_path / folder).mkdir(exist_ok=True)
        (tmp_path / folder / "s.svs").write_bytes(slide_path(CMU).read_bytes())  # two files
    first, second = tmp_path / "x" / "s.svs", tmp_path / "y" / "s.svs"
    into = tmp_path / "into"
    done = run_cli("embed", first, second, "--into", into, "--model", "efficientnet-lite0")
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"tilestore: error: {second}: its store would be {into / 's.ome.zarr'}, as {first}'s: "
        "each needs a store of its own (slides of one name: a folder each)"
    )
    assert not into.exists()
    with pytest.raises(OptionError, match="its store would be"):  # one sidecar folder too
        Stager([first, second], None, in_place=True, sidecars=tmp_path / "side")
    assert not (tmp_path / "side").exists()
    beside = Preparation.of(None, None, in_place=True)  # a sidecar beside each: two stores
    assert beside.once_each([first, second]) == [first, second]


def test_two_series_of_one_folder_bound_for_one_store_are_refused(tmp_path):
    """A DICOM folder's series each get a store; `-o` naming one store would take them all."""
    folder, store = tmp_path / "case", tmp_path / "one.ome.zarr"
    one_store_each([(folder, "1.2.3", tmp_path / "case-1.2.3.ome.zarr"),
                    (folder, "1.2.4", tmp_path / "case-1.2.4.ome.zarr")])  # fmt: skip
    with pytest.raises(OptionError) as refused:
        one_store_each([(folder, "1.2.3", store), (folder, "1.2.4", store)])
    assert str(refused.value) == (
        f"{folder}: its series 1.2.4 would be written into {store}, as series 1.2.3: give a "
        "folder, where each series gets a store of its own"
    )
