"""What a store's embeddings are, read without writing (`tilestore.embeddings.status`): each
state as the writer leaves it, on real stores embedded with efficientnet-lite0 on the CPU."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

from tests.conftest import IHC, group_of
from tilestore.embeddings import (
    EmbeddingWriter,
    RunIdentity,
    embeddings_status,
    finishing_runs,
    model_folder,
    only_model,
)
from tilestore.embeddings.status import SlideVector
from tilestore.embeddings.write import lock_file, write_features
from tilestore.errors import OptionError, StoreError
from tilestore.plan import load_plan, save_plan
from tilestore.reading.opening import open_slide

LITE = "efficientnet-lite0"
RUN = {"batch_size": 16, "dtype": "float32", "precision": "fp32"}  # as embedded_cohort ran


@pytest.fixture
def copy(embedded_cohort, tmp_path):
    """A private copy of the embedded CMU-1-Small-Region store (plan 'classes'), by name."""

    def make(name: str = "a") -> Path:
        target = tmp_path / f"{name}.ome.zarr"
        shutil.copytree(embedded_cohort[0], target)
        return target

    return make


def _group(store: Path) -> zarr.Group:
    return zarr.open_group(store / group_of(store, LITE), mode="r+")


def interrupt(store: Path, undone: int = 2) -> None:
    """Leave the group as a killed run does: its last `undone` batches not done, unfinished."""
    group = _group(store)
    attrs = dict(group.attrs["tilestore"])
    for key in ("finished", "run"):
        attrs.pop(key, None)
    group.attrs["tilestore"] = {**attrs, "complete": False}
    flags = group["done"][:]
    flags[-undone:] = 0
    group["done"][:] = flags


def test_a_complete_group_says_its_plan_tiles_features_and_run(copy):
    store = copy()
    found = embeddings_status(store)
    assert found.name == "a" and len(found.groups) == 1
    group = found.groups[0]
    tiles = int(_group(store)["features"].shape[0])
    assert (group.model, group.state, group.plan) == (LITE, "complete", "classes")
    assert (group.tiles, group.tiles_done, group.dtype, group.dim) == (
        tiles,
        tiles,
        "float32",
        1280,
    )
    assert group.batches == group.batches_done == -(-tiles // 16)
    assert group.finished and group.lock is None and group.slide_vectors == ()
    assert group.run == RUN and not group.left() and not group.blocked
    assert json.loads(json.dumps(found.to_json()))["groups"][0]["state"] == "complete"


def test_an_interrupted_group_is_partial_with_the_tiles_its_done_batches_hold(copy):
    store = copy()
    tiles = int(_group(store)["features"].shape[0])
    interrupt(store, undone=2)
    group = embeddings_status(store, LITE).groups[0]
    last = tiles - 16 * (-(-tiles // 16) - 1)  # the last batch's tiles
    assert group.state == "partial" and group.finished is None
    assert group.tiles_done == tiles - 16 - last and group.batches_done == group.batches - 2
    assert (
        group.note
        == f"{group.batches_done} of {group.batches} batches done: the same run resumes it"
    )
    assert group.left()


def test_a_live_lock_is_running_and_a_dead_ones_is_not(copy, embedded_cohort):
    store = copy()
    slide = open_slide(store)
    plan, uid = load_plan(slide, "classes")
    model = dict(_group(store).attrs["tilestore"]["model"])
    identity = RunIdentity(model, 16, "float32", "fp32", False)
    writer = EmbeddingWriter(slide, plan, uid, identity, overwrite=True, create=False)
    try:
        group = embeddings_status(store, LITE).groups[0]
        assert group.state == "running" and group.lock.pid == os.getpid()
        assert group.lock.host == socket.gethostname() and 0 <= group.lock.age_s < 60
        assert group.note.startswith(f"written by pid {os.getpid()} on ")
    finally:
        writer.abandon()
    assert embeddings_status(store, LITE).groups[0].state == "complete"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    lock = lock_file(store, group_of(store, LITE))
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": int(gone.stdout)}))
    assert embeddings_status(store, LITE).groups[0].state == "complete"  # the next run takes it


def test_a_model_without_a_group_is_not_started(copy, store):
    assert embeddings_status(copy(), "uni").groups[0].state == "not started"
    bare = store(IHC, mpp=0.5)
    assert embeddings_status(bare).groups == ()
    group = embeddings_status(bare, LITE).groups[0]
    assert (group.state, group.tiles, group.note) == ("not started", 0, f"no {model_folder(LITE)}")


def test_another_plans_group_stands_beside_and_a_replaced_plan_is_named_so(copy):
    store = copy()
    # a group of another plan of the model is made beside the one there: not started, never
    # "other plan" (one model's groups of several plans live side by side)
    group = embeddings_status(store, LITE, plan="other").groups[0]
    assert group.state == "not started" and not group.blocked
    assert embeddings_status(copy("b"), LITE, plan="classes").groups[0].state == "complete"
    # the plan the group was made from stored again (other tiles under its name): the group no
    # longer stands for it, whether the plan is named or not (it said complete, exit 0)
    slide = open_slide(store)
    plan, uid = load_plan(slide, "classes")
    new_uid = save_plan(slide, plan.subset(np.arange(len(plan)) % 2 == 0), overwrite=True)
    for asked in ("classes", None):
        group = embeddings_status(store, LITE, plan=asked).groups[0]
        assert group.state == "other plan" and group.blocked
        assert group.note == (
            f"made from an earlier plan 'classes' (uid {uid}), stored again since (uid "
            f"{new_uid}); pass overwrite=True to embed the plan stored now"
        )


def _shape(store: Path) -> None:
    meta = store / group_of(store, LITE) / "features" / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["shape"] = [doc["shape"][0] - 1, doc["shape"][1]]
    meta.write_text(json.dumps(doc))


def _garbage(store: Path) -> None:
    (store / group_of(store, LITE) / "zarr.json").write_text("{ not json")


def _done_lost(store: Path) -> None:
    _group(store)["done"][0] = 0  # marked complete, a batch not done


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (_shape, "features has shape"),
        (_garbage, "is damaged (JSONDecodeError"),
        (_done_lost, "is marked complete with"),
    ],
)
def test_a_damaged_group_is_damaged_with_the_readers_line(copy, damage, said):
    store = copy()
    damage(store)
    group = embeddings_status(store, LITE).groups[0]
    assert group.state == "damaged" and group.blocked and not group.left()
    assert said in group.note and str(store) in group.note


def test_slide_vectors_are_listed_current_or_stale(copy):
    from tilestore.embed.slides import embed_slides

    store = copy()
    embed_slides([store], "mean", model=LITE, device="cpu")
    group = embeddings_status(store).groups[0]
    assert group.slide_vectors == (SlideVector("mean", 1280, "current"),)
    assert group.has_vector("mean") and not group.has_vector("max")
    assert not group.left("mean") and group.left("max")
    tiles = _group(store)
    tiles.attrs["tilestore"] = {**tiles.attrs["tilestore"], "finished": "later"}
    assert embeddings_status(store).groups[0].slide_vectors[0].state == "stale"


def test_what_is_not_a_store_is_one_error(tmp_path):
    with pytest.raises(StoreError, match=r"nope.ome.zarr: not a store \(no zarr.json\)"):
        embeddings_status(tmp_path / "nope.ome.zarr")


def _listing(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in folder.rglob("*")}


def _now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def test_reading_the_status_writes_nothing(copy, store):
    stores = [copy("a"), copy("b"), copy("c"), store(IHC, mpp=0.5)]  # in one folder
    interrupt(stores[1])
    _shape(stores[2])
    folder = stores[0].parent
    lock_file(stores[0], group_of(stores[0], LITE)).write_text(
        json.dumps({"host": "elsewhere", "pid": 1, "since": "2020-01-01T00:00:00+00:00",
                    "beat": _now_iso()})  # beating now: another host's live run
    )  # fmt: skip
    before = _listing(folder)
    found = [embeddings_status(s, LITE, plan="classes").groups[0].state for s in stores]
    assert found == ["running", "partial", "damaged", "not started"]
    assert [g.state for s in stores for g in embeddings_status(s).groups] == found[:3]
    assert _listing(folder) == before


def test_the_runs_that_finish_a_cohort_repeat_what_each_resume_needs(copy, store):
    done, half, bare = copy("a"), copy("b"), store(IHC, mpp=0.5)
    interrupt(half)
    found = [(str(s), embeddings_status(s, LITE).groups[0]) for s in (done, half, bare)]
    runs = finishing_runs(found, LITE)
    assert [(r.stores, r.options) for r in runs] == [
        ((str(half),), {"model": LITE, **RUN, "plan": "classes"}),
        ((str(bare),), {"model": LITE, "dtype": "float32", "precision": "fp32"}),
    ]
    with_vectors = finishing_runs(found, LITE, plan="p", slide_encoder="mean")
    assert [(r.stores, r.options) for r in with_vectors] == [
        ((str(done),), {"model": LITE, "slide_encoder": "mean"}),
        ((str(half),), {"model": LITE, **RUN, "slide_encoder": "mean"}),
        ((str(bare),), {"model": LITE, "dtype": "float32", "precision": "fp32",
                        "slide_encoder": "mean"}),
    ]  # fmt: skip


def test_the_only_model_of_a_cohort_or_a_refusal_naming_those_found(copy, store):
    one, two, bare = copy("a"), copy("b"), store(IHC, mpp=0.5)
    tiles = int(_group(two)["features"].shape[0])
    write_features(two, {"name": "other"}, np.ones((tiles, 4), np.float32), plan="classes")
    assert only_model([embeddings_status(one)]) == LITE
    # a store without any group is one not started, not a question
    assert only_model([embeddings_status(s) for s in (one, bare)]) == LITE
    assert only_model([embeddings_status(bare)]) is None
    with pytest.raises(OptionError, match=rf"embeddings found: {LITE} \(2 stores\), other \(1 "):
        only_model([embeddings_status(s) for s in (one, two)])
    with pytest.raises(OptionError, match=r"1 of 3 stores hold none; name one with model=<name>"):
        only_model([embeddings_status(s) for s in (one, two, bare)])
