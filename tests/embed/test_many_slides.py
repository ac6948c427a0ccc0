"""A cohort of many small slides (issue 68): stores opened ahead of the GPU on threads,
each slide's writes on a lane of its own, the per-slide fixed cost in the report."""

from __future__ import annotations

import os
import random
import shutil
import signal
import threading
import time

import numpy as np
import pytest
import torch
import zarr

from tilestore.embed.lanes import Lanes

# -- lanes: each key's steps in order, the keys side by side --------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_each_lane_keeps_its_order_and_lanes_run_at_once(seed):
    rng = random.Random(seed)
    ran: dict[int, list[int]] = {}
    running, most = [0], [0]
    lock = threading.Lock()

    def step(key: int, index: int, pause: float):
        def run():
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            time.sleep(pause)
            with lock:
                running[0] -= 1
                ran.setdefault(key, []).append(index)

        return run

    lanes = Lanes(4, limit=6)
    sent: dict[int, int] = {}
    for _ in range(120):
        key = rng.randrange(8)
        sent[key] = sent.get(key, 0) + 1
        lanes.submit(key, step(key, sent[key], rng.random() * 0.004))
    lanes.close()
    assert {k: len(v) for k, v in ran.items()} == sent
    for key, order in ran.items():
        assert order == sorted(order), (key, order)  # never out of its submission order
    assert most[0] > 1  # keys ran at once
    assert most[0] <= 4  # on the pool's threads, no more


def test_a_step_that_raises_is_kept_and_its_lane_goes_on():
    done = []
    lanes = Lanes(2, limit=4)
    lanes.submit("a", lambda: done.append(1))
    lanes.submit("a", lambda: 1 / 0)
    lanes.submit("a", lambda: done.append(3))
    lanes.close()
    assert done == [1, 3]
    assert isinstance(lanes.error, ZeroDivisionError)


def test_submit_waits_past_the_limit():
    gate = threading.Event()
    lanes = Lanes(1, limit=2)
    lanes.submit("a", gate.wait)
    lanes.submit("a", lambda: None)
    third = threading.Thread(target=lanes.submit, args=("b", lambda: None))
    third.start()
    third.join(0.2)
    assert third.is_alive()  # two steps queued: the third waits
    gate.set()
    third.join(5)
    assert not third.is_alive()
    lanes.close()


# -- a cohort of small stores on the engine --------------------------------------------------------


@pytest.fixture
def cohort(tmp_path, stores):
    made = []
    for i in range(5):
        target = tmp_path / f"s{i}.ome.zarr"
        shutil.copytree(stores("CMU-1-Small-Region.svs"), target)
        made.append(target)
    return made


def _features(store, model="efficientnet-lite0"):
    (folder,) = [p for p in (store / "embeddings" / model).iterdir() if p.is_dir()]
    return np.asarray(zarr.open_group(folder, mode="r")["features"][:])


@pytest.mark.slow
def test_a_cohort_of_small_stores_is_each_store_alone(cohort, tmp_path, lite):
    """Opened ahead and written on lanes, each store's features are those it gets embedded
    alone (bit for bit: its batches hold the same tiles), the report keeps the input order,
    and says each slide's fixed cost and the run's median."""
    from tilestore.embed.engine import embed
    from tilestore.embed.report import format_report
    from tilestore.embed.settings import Options

    options = Options(device="cpu", precision="fp32", dtype="float32", batch_size=16)
    alone = tmp_path / "alone.ome.zarr"
    shutil.copytree(cohort[2], alone)
    embed([alone], lite, options=options)
    report = embed(cohort, lite, options=options)
    assert not report.failures and report.finished and len(report.finished) == 5
    assert [s["store"] for s in report.slides] == [str(s) for s in cohort]
    assert np.array_equal(_features(cohort[2]), _features(alone))
    for entry in report.slides:
        fixed = entry["fixed_s"]
        assert {"open_plan", "group", "finish"} <= set(fixed), fixed
        assert all(v >= 0 for v in fixed.values())
    assert sum("gpu_waited" in s["fixed_s"] for s in report.slides) == 4  # the first: the fill
    per = report.per_slide
    assert per["slides"] == 5 and set(per["parts_median_ms"]) == {"open_plan", "group", "finish"}
    sums = [
        1000 * sum(s["fixed_s"][p] for p in ("open_plan", "group", "finish")) for s in report.slides
    ]
    assert per["beside_ms"]["max"] == pytest.approx(max(sums), abs=0.2)
    (line,) = [ln for ln in format_report(report) if ln.startswith("per-slide fixed cost")]
    assert "ms median" in line and "open and plan" in line


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_small_slides_read_early_and_cut_at_once_are_each_store_alone(
    cohort, tmp_path, monkeypatch
):
    """On the GPU a small slide's rows are joined into one step and the next slides' rows
    decoded before their turn (`early_rows`), while one is cut: each store's features are
    still the ones it gets alone, bit for bit."""
    from tilestore.embed import produce
    from tilestore.embed.engine import embed
    from tilestore.embed.models import load_model
    from tilestore.embed.settings import Options

    tiny = load_model("random:vit_tiny_patch16_224")  # one model, both ways
    name = "random-vit_tiny_patch16_224"

    opened, early, waited = produce.Ahead.opened, [], []

    def all_opened(self, most):  # the cohort's stores all opened before the first is cut
        deadline = time.monotonic() + 20
        while not waited and len(opened(self, most)) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        waited.append(True)  # once: later calls find them there (no wait for more to come)
        return opened(self, most)

    def recorded(*args, **kwargs):
        rows = early_rows(*args, **kwargs)
        early.append(rows is not None)
        return rows

    options = Options(device="cuda", precision="fp32", dtype="float32", batch_size=16)
    alone = [tmp_path / f"alone{i}.ome.zarr" for i in range(len(cohort))]
    for store, copy in zip(cohort, alone, strict=True):
        shutil.copytree(store, copy)
    for copy in alone:  # before the waits below: a run of one store would wait them out
        embed([copy], tiny, options=options)
    early_rows = produce.early_rows
    monkeypatch.setattr(produce.Ahead, "opened", all_opened)
    monkeypatch.setattr(produce, "early_rows", recorded)
    report = embed(cohort, tiny, options=options)
    assert not report.failures and len(report.finished) == len(cohort)
    assert early == [True] * (len(cohort) - 1)  # every slide after the first read early
    for store, copy in zip(cohort, alone, strict=True):
        assert np.array_equal(_features(store, name), _features(copy, name))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cohort_of_small_slides_page_locks_its_decode_blocks(cohort, monkeypatch):
    """A small slide is one step, never at a third batch of its own; the decode blocks are
    page-locked once three batches' tiles are cut from them across slides. Before, a cohort
    of small slides never pinned them: every row went by a pageable copy, synchronous in the
    producer (issue 68)."""
    from tilestore.embed import procdecode
    from tilestore.embed.engine import embed
    from tilestore.embed.models import load_model
    from tilestore.embed.settings import Options

    start, pinned = procdecode.ProcessDecoder.start_pinning, []

    def recorded(self):
        start(self)
        self.wait_pinned()
        pinned.append((self.tiles_cut, len(self.pinned), len(self.blocks), self.pin_error))

    monkeypatch.setattr(procdecode.ProcessDecoder, "start_pinning", recorded)
    options = Options(device="cuda", precision="fp32", dtype="float32", batch_size=32)
    report = embed(cohort, load_model("random:vit_tiny_patch16_224"), options=options)
    assert not report.failures and len(report.finished) == len(cohort)
    assert pinned, "the decode blocks were never page-locked"
    cut, count, blocks, error = pinned[0]
    assert 3 * 32 <= cut < 3 * 32 + 45  # at the slide whose rows reached three batches
    assert error is None and count == blocks > 0


def test_a_slide_whose_data_fails_while_read_early_fails_at_its_turn_alone(stores):
    """The next slide decided (and its rows asked) while one is cut: where its own data
    fails there (its shard index, its positions), that failure is kept for its turn, where
    it fails alone; the slide being cut goes on. The rows asked before the failure are
    given back."""
    from concurrent.futures import Future
    from types import SimpleNamespace

    from tests.embed.conftest import settings
    from tilestore.embed.produce import Producer
    from tilestore.embed.report import RunReport, Stats, no_span
    from tilestore.embed.rows import early_rows
    from tilestore.errors import ChunkError
    from tilestore.plan import PlanOptions, plan_over_tissue
    from tilestore.plan.tiles import chunk_schedule, joined
    from tilestore.reading.opening import open_slide

    damaged = ChunkError("s2.ome.zarr: level 0: shard c/0/0/0 is truncated")

    class Damaged:
        def chunks(self, level):
            raise damaged

    plan = SimpleNamespace(spec=SimpleNamespace(level=0))
    job = SimpleNamespace(store="s2.ome.zarr", todo=np.arange(3), slide=Damaged(), plan=plan)
    producer = Producer(settings(), Stats(), None, None, lambda job: None)
    report = RunReport("m", "cpu", "cpu", 16, "fp32", False)
    producer.ahead, producer.report = SimpleNamespace(opened=lambda most: [job]), report
    producer._read_early(threading.Event())
    (early,) = producer.early
    assert early.job is job and early.rows is None and early.error is damaged
    producer._read_early(threading.Event())  # nothing more decided past it
    assert len(producer.early) == 1
    with pytest.raises(ChunkError, match="truncated"):
        producer._job(job, producer.report, None, None, print, threading.Event(), early)

    class Procs:  # blocks free; the second step's shard index found damaged
        workers, blocks = [0, 0], [SimpleNamespace(size=1 << 30)] * 32

        def __init__(self):
            self.asked, self.released = 0, []

        def room(self, nbytes):
            return len(self.blocks)

        def submit(self, *args, **kwargs):
            self.asked += 1
            if self.asked == 2:
                raise damaged
            done = Future()
            done.set_result([])
            return self.asked, [done]

        def release(self, block, copied=None):
            self.released.append(block)

    slide = open_slide(stores("CMU-1-Small-Region.svs"))
    small = plan_over_tissue(slide, PlanOptions(mpp=0.5, tile=224), store_tissue=False)
    rows, procs = joined(chunk_schedule(small), small, 0), Procs()
    with pytest.raises(ChunkError, match="truncated"):
        early_rows(rows, settings(), no_span, slide.chunks(0), procs, threading.Event())
    assert procs.released == [1]  # the first step's block, given back

    # a slide that did not fit the blocks free then is asked again at the next step
    from tilestore.embed.decodeplan import DecodePlan

    fits, procs = [0], Procs()
    procs.room = lambda nbytes: fits[0]
    producer = Producer(settings(), Stats(), procs, None, lambda job: None)
    job = SimpleNamespace(
        store="s3.ome.zarr", todo=np.arange(len(small)), slide=slide, plan=small, read_out=None
    )
    producer.ahead, producer.report = SimpleNamespace(opened=lambda most: [job]), report
    producer._decode_plan = lambda job, reader, report: DecodePlan("processes", "test")
    producer._read_early(threading.Event())
    (early,) = producer.early
    assert early.rows is None and early.steps and procs.asked == 0
    fits[0] = 32
    producer._read_early(threading.Event())
    assert early.rows is not None and early.rows.asked_all and procs.asked == 1  # one step
    early.rows.close()


@pytest.mark.slow
def test_a_stop_releases_the_stores_opened_ahead(cohort, lite):
    """Stopped at the first batch, the stores opened ahead (their groups made, nothing
    written) are left as they were: no group, no lock."""
    from tilestore.embed.engine import embed
    from tilestore.embed.settings import Options
    from tilestore.errors import Interrupted

    def stop(done, total):  # Ctrl-C, as the terminal delivers it: to the main thread
        os.kill(os.getpid(), signal.SIGINT)

    options = Options(device="cpu", precision="fp32", dtype="float32", batch_size=16)
    # Python's own handler, as a terminal has it: a suite run in the background (`cmd &` in
    # a script) inherits SIGINT ignored, and the Ctrl-C would never come
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(Interrupted):
            embed(cohort, lite, options=options, progress=stop)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert not list(cohort[0].parent.glob(".*.lock"))  # beside the stores: none left
    untouched = [s for s in cohort if not (s / "embeddings" / "efficientnet-lite0").exists()]
    assert len(untouched) >= 3  # all but the one (or two) that had batches written


def test_a_store_whose_group_maker_dies_fails_alone_and_keeps_no_lock(cohort, lite):
    """The worker making the third store's group dies (an OOM kill): that store fails in
    its line, its lock released, nothing of its group left; the stores around it are
    opened as ever (a new worker makes the next group)."""
    from tilestore.embed.engine import Embedder
    from tilestore.embed.inputs import as_staged
    from tilestore.embed.jobs import store_jobs
    from tilestore.embed.report import RunReport
    from tilestore.embed.settings import Options
    from tilestore.embeddings.write import make_group
    from tilestore.workers import WorkerGone

    def maker(function, store, *args):
        if store.endswith("s2.ome.zarr"):
            raise WorkerGone("the worker process running make_group died (exit code -9)")
        time.sleep(0.2)  # the stores after it are being opened meanwhile
        return make_group(store, *args)

    options = Options(device="cpu", precision="fp32", dtype="float32", batch_size=16)
    with Embedder(lite, options) as embedder:
        report = RunReport.start(embedder.loaded.describe(), embedder.settings)
        jobs = list(store_jobs(
            as_staged(cohort), embedder.loaded.spec, None, embedder.writer_identity(),
            False, report, makers=maker,
        ))  # fmt: skip
        assert [job.store for job in jobs] == [cohort[i] for i in (0, 1, 3, 4)]
        (failure,) = report.failures
        assert failure["store"] == str(cohort[2])
        assert failure["error"].startswith("making embeddings/efficientnet-lite0/")
        assert failure["error"].endswith(
            ": the worker process running make_group died (exit code -9)"
        )
        assert not (cohort[2] / "embeddings" / "efficientnet-lite0").exists()
        for job in jobs:  # the jobs yielded are the run's to release, as its `prepared` does
            job.writer.abandon()
    assert not list(cohort[0].parent.glob(".*.lock"))
    assert not [s for s in cohort if (s / "embeddings" / "efficientnet-lite0").exists()]


@pytest.mark.slow
def test_a_slide_not_finite_in_a_packed_batch_fails_alone(stores, tmp_path, lite, monkeypatch):
    """Three slides' last partial batches share one model batch; the model makes NaN for
    the middle slide's tiles only (those of a green image): that slide fails in its line,
    nothing of it written, while the two beside it in the same batch are complete and
    finite, as each is embedded alone."""
    import imageio.v3 as iio
    import torch

    from tilestore.conversion.converter import convert
    from tilestore.embed.engine import embed
    from tilestore.embed.forward import Forward
    from tilestore.embed.settings import Options
    from tilestore.plan import PlanOptions

    rng = np.random.default_rng(0)
    green = np.zeros((448, 448, 3), np.uint8)
    green[..., 1] = rng.integers(150, 255, (448, 448))
    iio.imwrite(tmp_path / "green.png", green)
    middle = convert(tmp_path / "green.png", tmp_path, mpp=0.5).store
    first, last = tmp_path / "a.ome.zarr", tmp_path / "c.ome.zarr"
    for target in (first, last):
        shutil.copytree(stores("CMU-1-Small-Region.svs"), target)
    call, mixed = Forward.__call__, []

    def poisoned(self, tiles, count):  # NaN rows for the green tiles alone
        rows = call(self, tiles, count)
        pixels = tiles[: len(rows)].float().mean(dim=(1, 2))  # the rows: the first `count`
        green = pixels[:, 1] > pixels[:, 0] + 60
        mixed.append(0 < int(green.sum()) < len(rows))
        return torch.where(green[:, None], torch.full_like(rows, float("nan")), rows)

    monkeypatch.setattr(Forward, "__call__", poisoned)
    options = Options(device="cpu", precision="fp32", dtype="float32", batch_size=32)
    plan = PlanOptions(min_tissue=0)
    alone = tmp_path / "alone.ome.zarr"
    shutil.copytree(first, alone)
    embed([alone], lite, options=options, plan=plan)
    report = embed([first, middle, last], lite, options=options, plan=plan)
    assert any(mixed)  # a batch held green tiles and the others' (packed)
    (failure,) = report.failures
    assert failure["store"] == str(middle)
    assert "made NaN or infinite features for 4 tile(s) of batch 0" in failure["error"]
    assert not (middle / "embeddings" / "efficientnet-lite0").exists()
    assert [str(s) for s in report.finished] == [str(first), str(last)]
    features = _features(first)
    assert len(features) % 32 and np.isfinite(features).all()  # its last batch was packed
    assert np.array_equal(features, _features(alone))
    assert np.isfinite(_features(last)).all()


@pytest.mark.slow
def test_a_store_process_killed_fails_its_slides_alone_and_a_rerun_finishes_them(
    cohort, tmp_path, lite
):
    """A store process is killed (an OOM kill) once the first rows are written: the slides
    it held fail, each in its line naming its store and the process's death; the others
    are complete, each as embedded alone; the run goes on to the end. The rerun finishes the
    failed ones (their locks, held by the dead process, taken over)."""
    import psutil

    from tilestore.embed.engine import Embedder
    from tilestore.embed.settings import Options
    from tilestore.errors import TilestoreWarning

    options = Options(device="cpu", precision="fp32", dtype="float32", batch_size=16)
    alone = tmp_path / "alone.ome.zarr"
    shutil.copytree(cohort[0], alone)
    killed = []

    def kill_one(done, total):
        if killed:
            return
        sides = [p for p in psutil.Process().children()
                 if "tilestore.embed.storeside" in " ".join(p.cmdline())]  # fmt: skip
        assert sides  # the stores' work is done in store processes
        sides[0].kill()  # (not waited for here: its run reaps it, and reads its exit status)
        killed.append(sides[0].pid)

    with Embedder(lite, options) as embedder:
        embedder.embed([alone])
        report = embedder.embed(cohort, progress=kill_one)
        assert killed and report.failures  # the dead process held at least the first slide
        for failure in report.failures:
            assert failure["error"].startswith(
                ("the store process writing embeddings/efficientnet-lite0/",
                 "the store process opening it died")
            ), failure  # fmt: skip
            assert "died (exit code -9)" in failure["error"]
        failed = {f["store"] for f in report.failures}
        finished = {s["store"] for s in report.slides if "seconds" in s and not s.get("failed")}
        assert failed | finished == {str(s) for s in cohort} and not failed & finished
        for store in cohort:
            if str(store) in finished:
                assert np.array_equal(_features(store), _features(alone))
        gone = r"took over the lock of .*\(its process is gone\)"  # the dead process's locks
        with pytest.warns(TilestoreWarning, match=gone):
            again = embedder.embed(cohort)
    assert not again.failures
    assert {s["store"] for s in again.slides if "seconds" in s} == failed
    for store in cohort:
        assert np.array_equal(_features(store), _features(alone))
    assert not list(cohort[0].parent.glob(".*.lock"))


def test_a_halted_run_opens_nothing_more_in_a_store_process(cohort, lite):
    """The run stopped (`StoreProcesses.halt`): a store process stops that run's openings at
    their next step, each releasing what it took (no lock, no group left); another run's
    opening goes on."""
    from tilestore.embed.engine import Embedder
    from tilestore.embed.settings import Options
    from tilestore.embed.storeside import Request, Side
    from tilestore.errors import StoreError

    options = Options(device="cpu", precision="fp32", dtype="float32", batch_size=16)
    with Embedder(lite, options) as embedder:
        spec, identity = embedder.loaded.spec, embedder.writer_identity()
    side = Side()
    side._halt(None, "stopped")
    request = Request(str(cohort[0]), spec, None, identity, False, None, False, False, "stopped")
    with pytest.raises(StoreError, match="not opened: the run stopped"):
        side._open(0, request)
    assert not side.writers and not list(cohort[0].parent.glob(".*.lock"))
    assert not (cohort[0] / "embeddings" / "efficientnet-lite0").exists()
    going = Request(str(cohort[1]), spec, None, identity, False, None, False, False, "another")
    found = side._open(1, going)
    assert found["todo"].size and list(cohort[1].parent.glob(".*.lock"))
    assert side._abandon(1)[0].startswith("nothing was written")
    assert not list(cohort[1].parent.glob(".*.lock"))


def test_a_store_named_relatively_is_the_one_in_the_folder_the_caller_is_in(
    cohort, tmp_path, lite, monkeypatch
):
    """The store processes are kept between runs: a notebook that moves to another folder
    between two runs embeds `s0.ome.zarr` of the folder it is in each time (they start
    again there), and the messages name the store as given."""
    from tilestore.embed.engine import Embedder
    from tilestore.embed.settings import Options

    options = Options(device="cpu", precision="fp32", dtype="float32", batch_size=16)
    other = tmp_path / "other"
    other.mkdir()
    shutil.copytree(cohort[0], other / "s0.ome.zarr")
    with Embedder(lite, options) as embedder:
        monkeypatch.chdir(cohort[0].parent)
        first = embedder.embed(["s0.ome.zarr"])
        monkeypatch.chdir(other)
        second = embedder.embed(["s0.ome.zarr"])
    for report in (first, second):
        assert not report.failures and [s["store"] for s in report.slides] == ["s0.ome.zarr"]
    for folder in (cohort[0].parent, other):
        assert (folder / "s0.ome.zarr" / "embeddings" / "efficientnet-lite0").is_dir()


def test_a_store_process_sends_the_slide_it_opened_and_a_slide_in_place_is_opened_here(
    cohort, tmp_path, lite
):
    """A store's slide travels from the store process that opened it, the positions of the
    plan's level loaded, and reads the same pixels as the store opened here; a slide read in
    place (its readers hold the slide file open) is not sent: the run opens it itself."""
    import pickle

    from tests.conftest import SLIDES
    from tilestore import open_in_place
    from tilestore.embed.engine import Embedder
    from tilestore.embed.settings import Options
    from tilestore.embed.storeside import Request, Side, _shipped
    from tilestore.plan import PlanOptions, plan_over_tissue
    from tilestore.reading import open_slide

    options = Options(device="cpu", precision="fp32", dtype="float32", batch_size=16)
    with Embedder(lite, options) as embedder:
        spec, identity = embedder.loaded.spec, embedder.writer_identity()
    side = Side()
    request = Request(str(cohort[0]), spec, None, identity, False, None, False, False, "run")
    found = pickle.loads(pickle.dumps(side._open(0, request)))
    try:
        sent, level = found["slide"], found["ready"].plan.spec.level
        assert sent.chunks(level)._positions._table is not None  # loaded there
        here = open_slide(cohort[0])
        assert sent.levels == here.levels and sent.record == here.record
        np.testing.assert_array_equal(
            sent.read_region(0, 0, 300, 200, level=0), here.read_region(0, 0, 300, 200, level=0)
        )
    finally:
        side._abandon(0)
    in_place = open_in_place(SLIDES / "CMU-1-Small-Region.svs", sidecars=tmp_path / "sidecars")
    plan = plan_over_tissue(in_place, PlanOptions(mpp=0.5, tile=224), store_tissue=False)
    assert _shipped(in_place, plan) is None


def test_a_store_process_makes_the_slides_steps_and_locates_their_chunks(cohort, lite):
    """Asked (`Wanted`), a store process makes the steps of the slide's tiles to do as the
    run would (`gpu_steps`, joined up to the run's limit) and locates each step's new
    chunks as the run's reader does; nothing where nothing is asked; a level whose
    positions are damaged gets its steps, its chunks left to be located (and the damage
    found) where the run reads them."""
    import pickle
    import shutil

    from tilestore.embed.engine import Embedder
    from tilestore.embed.readout import JOIN_PIXELS, Wanted, gpu_steps
    from tilestore.embed.settings import Options
    from tilestore.embed.storeside import Request, Side
    from tilestore.reading import open_slide

    options = Options(device="cpu", precision="fp32", dtype="float32", batch_size=16)
    with Embedder(lite, options) as embedder:
        spec, identity = embedder.loaded.spec, embedder.writer_identity()
    side = Side()

    def opened(key, store, wanted, most=None):
        request = Request(str(store), spec, None, identity, False, most, False, False, "run")
        found = pickle.loads(pickle.dumps(side._open(key, request, wanted)))
        side._abandon(key)
        return found

    for key, (join, most) in enumerate(((JOIN_PIXELS, None), (0, None), (0, 16))):
        found = opened(key, cohort[0], Wanted(True, join), most)
        plan, todo, made = found["ready"].plan, found["todo"], found["read_out"]
        assert len(todo) == (most or len(plan))  # a trial's first batch: its tiles alone
        want = gpu_steps(plan.subset(todo), join)
        assert len(made.steps) == len(want) and (len(want) == 1) == bool(join)  # rows joined
        for got, step in zip(made.steps, want, strict=True):
            for field in ("tiles", "load", "drop"):
                np.testing.assert_array_equal(getattr(got, field), getattr(step, field))
        reader = open_slide(cohort[0]).chunks(plan.spec.level)
        for step, located in zip(want, made.located, strict=True):
            coords = [tuple(rc) for rc in step.load.tolist()]
            assert located.unpacked() == reader.locations(coords)
    assert opened(3, cohort[0], None)["read_out"] is None
    only_steps = opened(4, cohort[0], Wanted(False, JOIN_PIXELS))["read_out"]
    assert only_steps.steps and only_steps.located is None
    shutil.rmtree(cohort[1] / "crc32c" / "0")  # level 0's positions gone
    damaged = opened(5, cohort[1], Wanted(True, JOIN_PIXELS))["read_out"]
    assert damaged.steps and damaged.located is None


def test_a_run_on_a_gpu_gets_each_slides_steps_from_its_store_process(cohort, lite):
    """The wiring: store processes asked for the read-out (`Wanted`, as a run on a GPU asks)
    put it on each job `store_jobs` makes; the producer takes the job's steps and located
    chunks as they are (`_steps`), and makes them itself for a job without."""
    from types import SimpleNamespace

    from tilestore.embed.engine import Embedder
    from tilestore.embed.inputs import as_staged
    from tilestore.embed.jobs import _open_job
    from tilestore.embed.produce import _steps
    from tilestore.embed.readout import JOIN_PIXELS, Wanted, gpu_steps
    from tilestore.embed.report import RunReport
    from tilestore.embed.settings import Options
    from tilestore.embed.storeside import StoreProcesses

    options = Options(device="cpu", precision="fp32", dtype="float32", batch_size=16)
    with Embedder(lite, options) as embedder:
        spec, identity = embedder.loaded.spec, embedder.writer_identity()
    processes = StoreProcesses(1, Wanted(True, JOIN_PIXELS))
    report = RunReport("m", "cpu", "cpu", 16, "fp32", False)
    try:
        (staged,) = as_staged([cohort[0]])
        job = _open_job(
            staged, spec, None, identity, False, report, None, False, False, processes
        ).job
        try:
            sub = job.plan.subset(job.todo)
            steps, located = _steps(job, sub)
            assert steps is job.read_out.steps and located is job.read_out.located
            assert len(located) == len(steps) == 1 and len(located[0].at) == len(steps[0].load)
            bare = SimpleNamespace(read_out=None)
            made, none = _steps(bare, sub)
            assert none is None and len(made) == len(gpu_steps(sub))
        finally:
            job.writer.abandon()
    finally:
        processes.close()


def test_a_slide_that_cannot_be_sent_releases_its_opening_there(cohort, lite, monkeypatch):
    """Whatever fails once the store is open in its store process (here, sending its slide)
    releases it there: no lock, no group, no writer held; a level whose positions are
    damaged is sent all the same, the damage left to be found where the run reads it."""
    import shutil

    from tilestore.embed import storeside
    from tilestore.embed.engine import Embedder
    from tilestore.embed.settings import Options
    from tilestore.embed.storeside import Request, Side

    options = Options(device="cpu", precision="fp32", dtype="float32", batch_size=16)
    with Embedder(lite, options) as embedder:
        spec, identity = embedder.loaded.spec, embedder.writer_identity()
    side = Side()

    def broken(slide, plan):
        raise MemoryError("no room to send it")

    monkeypatch.setattr(storeside, "_shipped", broken)
    request = Request(str(cohort[0]), spec, None, identity, False, None, False, False, "run")
    with pytest.raises(MemoryError):
        side._open(0, request)
    assert not side.writers and not list(cohort[0].parent.glob(".*.lock"))
    assert not (cohort[0] / "embeddings" / "efficientnet-lite0").exists()
    monkeypatch.undo()
    shutil.rmtree(cohort[1] / "crc32c" / "0")  # level 0's positions gone
    damaged = Request(str(cohort[1]), spec, None, identity, False, None, False, False, "run")
    found = side._open(1, damaged)
    assert found["slide"] is not None and 1 in side.writers
    assert side._abandon(1)[0].startswith("nothing was written")
    assert not list(cohort[1].parent.glob(".*.lock"))
