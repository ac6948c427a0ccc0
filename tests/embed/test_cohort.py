"""Cohorts on Dask: shares for job arrays, a LocalCluster run, a killed worker, a bad slide,
slide files made ready on the workers."""

from __future__ import annotations

import contextlib
import itertools
import operator
import os
import shutil
import signal
import threading
import time
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
import zarr
from distributed import Client, LocalCluster, WorkerPlugin
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import CMU, IHC, SLIDES, group_of, real, run_cli
from tests.corpus import rewrite_chunk
from tilestore.embed.cohort import (
    _Feed,
    _submit,
    embed_cohort,
    shard,
    slice_blocks,
    summary_lines,
)
from tilestore.embed.daskworker import PREPARER, SlidesPlugin, make_ready
from tilestore.embed.engine import embed
from tilestore.embed.inputs import Preparation
from tilestore.embed.jobs import Slice
from tilestore.embed.settings import TASK_TILES, Options, parse_shard
from tilestore.errors import OptionError, TilestoreError
from tilestore.plan import PlanOptions
from tilestore.reading.opening import open_slide

LITE = "efficientnet-lite0"
# two batches to a features shard: many shards, so slices of one slide go to both workers
OPTIONS = Options(batch_size=8, device="cpu", precision="fp32", dtype="float32", shard_tiles=16)
PLAN = PlanOptions(mpp=0.5, tile=224, stride=112)  # ~170 tiles on CMU: many slices


@pytest.fixture
def cohort(tmp_path, stores):
    """Fresh copies of CMU-1-Small-Region and the IHC PNG (mpp 0.5) under `name`/."""

    def make(name: str):
        root = tmp_path / name
        root.mkdir()
        shutil.copytree(stores(CMU), root / "CMU-1-Small-Region.ome.zarr")
        shutil.copytree(stores(IHC, mpp=0.5), root / "skimage_ihc.ome.zarr")
        return sorted(root.glob("*.ome.zarr"))

    return make


@pytest.fixture(scope="module")
def client():
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client


def features(store):
    group = zarr.open_group(store / group_of(store, LITE), mode="r")
    return group["features"][:], group


def done_batches(paths) -> int:
    total = 0
    for p in paths:
        with contextlib.suppress(KeyError, FileNotFoundError, zarr.errors.BaseZarrError):
            total += int(zarr.open_group(p / group_of(p, LITE), mode="r")["done"][:].sum())
    return total


# -- shares for SLURM job arrays -----------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(n_stores=st.integers(0, 30), n=st.integers(1, 8))
def test_shards_partition_the_list_deterministically(n_stores, n):
    stores = [f"/nowhere/slide{i:03d}.ome.zarr" for i in range(n_stores)]
    shares = [shard(stores, k, n) for k in range(n)]
    flat = [s for share in shares for s in share]
    assert sorted(flat) == sorted(stores)  # every store once
    assert shares == [shard(list(reversed(stores)), k, n) for k in range(n)]  # order-free
    sizes = [len(share) for share in shares]
    assert max(sizes) - min(sizes) <= 1  # equal sizes (unopenable: size 0) spread evenly


def test_shards_balance_real_sizes(cohort):
    paths = cohort("a")
    first, second = shard(paths, 0, 2), shard(paths, 1, 2)
    assert first == [str(paths[0])] and second == [str(paths[1])]  # the largest goes first


def test_shard_argument_errors():
    assert parse_shard("3/10") == (3, 10)
    with pytest.raises(TilestoreError, match=r"^shard='3': expected 'K/N', e.g. '0/8'$"):
        parse_shard("3")
    with pytest.raises(TilestoreError, match=r"K must be in 0\.\.N-1"):
        shard([], 2, 2)
    # N past any job array: numpy's "Maximum allowed dimension exceeded" (an internal error)
    huge = "0/99999999999999999999"
    with pytest.raises(OptionError, match=rf"^shard='{huge}': N must be 1 to 4,000,001 \("):
        parse_shard(huge)
    with pytest.raises(OptionError, match=r"^shard='0/4000002': N must be 1 to 4,000,001"):
        shard(["/nowhere/a.ome.zarr"], 0, 4_000_002)


def test_shares_past_the_stores_count_are_empty_and_cost_nothing():
    stores = [f"/nowhere/slide{i}.ome.zarr" for i in range(3)]
    assert [shard(stores, k, 4_000_001) for k in (0, 1, 2, 3, 4_000_000)] == [
        [stores[0]], [stores[1]], [stores[2]], [], []
    ]  # fmt: skip
    assert [shard(stores, k, 5) for k in range(5)] == [[s] for s in stores] + [[], []]


def test_a_huge_shard_count_is_one_line_from_the_command(tmp_path):
    run = run_cli("embed", tmp_path / "x.ome.zarr", "--model", "efficientnet-lite0",
                  "--shard", "0/99999999999999999999")  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert run.stderr == (
        "tilestore: error: --shard 0/99999999999999999999: N must be 1 to 4,000,001 "
        "(SLURM's largest job array)\n"
    )


@settings(max_examples=200, deadline=None)
@given(
    done=st.lists(st.booleans(), min_size=0, max_size=80),
    per_shard=st.integers(1, 9),
    per_slice=st.integers(1, 20),
)
def test_slices_are_whole_shards_of_the_batches_to_do(done, per_shard, per_slice):
    todo = np.flatnonzero(~np.array(done, bool))
    slices = slice_blocks(todo, per_shard, per_slice)
    assert np.array_equal(np.concatenate(slices) if slices else todo, todo)  # all, in order
    owners = {}
    for i, blocks in enumerate(slices):
        for shard_of in set((blocks // per_shard).tolist()):
            assert owners.setdefault(shard_of, i) == i  # no shard in two slices
    # as few slices as the size asked allows, each its even share (give or take a shard)
    count = -(-len(todo) // per_slice)
    assert len(slices) <= count
    sizes = [len(blocks) for blocks in slices]
    assert all(size < len(todo) / max(count, 1) + per_shard for size in sizes)
    if per_shard == 1 and sizes:  # no shard to round to: even to a batch
        assert max(sizes) - min(sizes) <= 1


# -- on a LocalCluster ---------------------------------------------------------------------


class _Threads:
    """A client whose workers' threads a test sets."""

    def __init__(self, threads: int) -> None:
        self.threads = threads

    def nthreads(self) -> dict[str, int]:
        return {f"w{i}": 1 for i in range(self.threads)}

    def processing(self) -> dict[str, list[str]]:  # the scheduler's view: none seen yet
        return {}


class _Done:
    def __init__(self, piece=None, key: str | None = None) -> None:
        self.over = False
        self.piece = piece
        self.key = key or f"run_slice-{id(self)}"

    def done(self) -> bool:
        return self.over


def _slice(tiles: int, name: str = "s") -> Slice:
    return Slice(name, "plan", 0, 1, tiles)


@settings(max_examples=80, deadline=None)
@given(
    threads=st.integers(0, 6),
    arrivals=st.lists(st.lists(st.integers(1, 20_000), max_size=6), max_size=8),
    finish=st.lists(st.integers(0, 9)),
)
def test_slices_go_out_largest_first_two_per_thread_then_one_at_the_tail(threads, arrivals, finish):
    """Stores land in any order of size (slide files made ready on the workers), a few at a
    time: what waits goes out largest slice first; no worker ever has more out than the rule
    of that moment allows (two per thread while more than two per thread wait, else one),
    each to a worker with the fewest out; none is lost; nothing stalls."""
    client = _Threads(threads)
    feed = _Feed(client)
    landing, steps, sent, names = iter(arrivals), iter(finish), [], itertools.count()
    while True:
        pieces = next(landing, None)
        if pieces is not None:
            feed.add(None, [_slice(t, f"s{next(names)}") for t in pieces])
        if pieces is None and not feed.waiting and not feed.running:
            break
        waiting = sorted((p.tiles for _, p in feed.waiting), reverse=True)
        per = 2 if len(feed.waiting) > 2 * threads else 1
        out = Counter(feed.running.values())
        for group, worker in feed.take():
            head = group[0][1]
            assert head.tiles == waiting[0]  # the largest waiting
            if len(group) > 1:  # small slices of several stores, together under the limit
                assert sum(p.tiles for _, p in group) <= TASK_TILES
                assert len({p.store for _, p in group}) == len(group)
            for _, piece in group:
                waiting.remove(piece.tiles)
            if threads:
                assert out[worker] == min(out[w] for w in client.nthreads())  # fewest out
                out[worker] += 1
                assert out[worker] <= per
            else:
                assert worker is None and not feed.running  # one, to whoever joins
                assert len(group) == 1
            sent.extend(piece for _, piece in group)
            feed.running[_Done(group)] = worker
        if feed.waiting and pieces is None:
            assert feed.running, "nothing out while slices wait: the cohort would stall"
        for future in sorted(feed.running, key=lambda f: f.piece[0][1].tiles)[: next(steps, 0) + 1]:
            future.over = True
        assert all(f.over for f in feed.finished(timeout=0))
        assert not any(f.over for f in feed.running)
    assert sorted(p.tiles for p in sent) == sorted(t for pieces in arrivals for t in pieces)


def test_at_the_tail_a_free_worker_gets_a_slice_while_another_has_two_out():
    """Four one-thread workers: A runs one and has one next from the two-per-thread phase,
    B and C run one, D none. Four are out, but D is free: the next slice goes to D."""
    feed = _Feed(_Threads(4))
    feed.running.update({_Done(): w for w in ("w0", "w0", "w1", "w2")})
    feed.add(None, [_slice(5), _slice(9), _slice(7)])
    assert [([p.tiles for _, p in g], w) for g, w in feed.take()] == [([9], "w3")]


def test_small_slides_go_many_to_a_task_and_spread_over_the_workers():
    """400 small slides (45 tiles): tasks of many slides each (a run's set-up paid once for
    them), under `TASK_TILES` and a worker's share of what waits; 8 small slides on 4
    workers: two a task, one task a worker, not all of them to one."""
    feed = _Feed(_Threads(4))
    feed.add(None, [_slice(45, f"s{i}") for i in range(400)])
    tasks = list(feed.take())
    assert all(sum(p.tiles for _, p in g) <= TASK_TILES for g, _ in tasks)
    assert [len(g) for g, _ in tasks] == [50] * 8  # two out a worker, even: 400 / 8
    taken = [p.store for g, _ in tasks for _, p in g] + [p.store for _, p in feed.waiting]
    assert sorted(taken) == sorted(f"s{i}" for i in range(400))  # each once, the rest waiting
    feed = _Feed(_Threads(4))
    feed.add(None, [_slice(45, f"s{i}") for i in range(8)])
    assert [(len(g), w) for g, w in feed.take()] == [(2, f"w{i}") for i in range(4)]
    feed = _Feed(_Threads(1))  # one store's two slices never share a task
    feed.add(None, [_slice(45, "a"), _slice(45, "a"), _slice(30000, "b")])
    assert [[p.store for _, p in g] for g, _ in feed.take()] == [["b"], ["a"]]
    feed = _Feed(_Threads(1))  # a task of several failed as a whole: each again, alone
    feed.add(None, [_slice(45, "c"), _slice(45, "d")], alone=True)
    feed.add(None, [_slice(45, "e"), _slice(45, "f")])
    tasks = list(feed.take())
    assert [[p.store for _, p in g] for g, _ in tasks] == [["c"], ["d"]]
    feed.running.update({_Done(g): w for g, w in tasks})
    assert list(feed.take()) == []  # two out on its one thread
    feed.running.clear()
    assert [[p.store for _, p in g] for g, _ in feed.take()] == [["e", "f"]]


def test_two_slices_go_to_two_free_workers_whatever_else_runs_there():
    """Each worker makes a slide ready (a task beside its thread, which Dask's scheduler
    counts as work): the coordinator's placement does not see it, so two slices landing go
    one to each free worker, not both to one."""
    feed = _Feed(_Threads(2))
    feed.add(None, [_slice(16384), _slice(13007)])
    assert [([p.tiles for _, p in g], w) for g, w in feed.take()] == [
        ([16384], "w0"),
        ([13007], "w1"),
    ]


def test_placement_follows_where_the_scheduler_has_a_slice():
    """A slice sent to w0 that the scheduler shows on w1 (stolen, or run again after a
    loss) counts for w1; a slide being made ready on w0 counts for nothing: w0 is free."""
    client = _Threads(2)
    client.processing = lambda: {"w0": ["make_ready-1"], "w1": ["run_slice-a"]}
    feed = _Feed(client)
    feed.running[_Done(_slice(9), "run_slice-a")] = "w0"
    feed.add(None, [_slice(5)])
    assert [w for _, w in feed.take()] == ["w0"]


def test_a_failed_stores_waiting_slices_are_dropped_others_kept():
    feed, failed, other = _Feed(_Threads(1)), object(), object()
    feed.add(failed, [_slice(9), _slice(3)])
    feed.add(other, [_slice(5)])
    assert feed.drop(failed) == 2
    assert [(s, p.tiles) for s, p in feed.waiting] == [(other, 5)]


def test_a_slice_with_no_worker_yet_goes_to_the_first_that_joins():
    """No worker: one slice goes out unplaced (Dask refuses allow_other_workers without
    workers: the cohort stopped), and runs once a worker joins."""
    with (
        LocalCluster(n_workers=0, processes=False, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        feed = _Feed(client)
        feed.add(None, [_slice(5), _slice(4)])
        (([(_, piece)], worker),) = feed.take()
        assert worker is None
        future = _submit(client, operator.attrgetter("tiles"), piece, worker)
        cluster.scale(1)
        assert future.result(timeout=60) == 5


def test_a_bigger_slice_landing_later_goes_out_before_smaller_ones_waiting():
    feed = _Feed(_Threads(1))
    feed.running[_Done()] = "w0"
    feed.add(None, [_slice(10801, "slide04")])
    feed.add(None, [_slice(17160, "slide05"), _slice(4148, "slide02")])
    assert [p.store for _, p in feed.waiting] == ["slide05", "slide04", "slide02"]


def test_the_feed_returns_cancelled_slices_as_finished(client):
    """A failed slide's other slices are cancelled: waiting on them is not an error (Dask's
    wait raises for a cancelled future), they come back finished, the others keep running."""
    feed = _Feed(client)
    slow, gone = (client.submit(time.sleep, 30, pure=False) for _ in range(2))
    client.cancel([gone])
    feed.running.update({slow: None, gone: None})
    assert feed.finished(timeout=5.0) == [gone]
    assert list(feed.running) == [slow]
    client.cancel([slow])


def test_cluster_run_equals_one_process(cohort, client):
    alone = cohort("alone")
    embed(alone, LITE, plan=PLAN, options=OPTIONS)
    spread = cohort("spread")
    report = embed_cohort(spread, LITE, client, plan=PLAN, options=OPTIONS, slice_tiles=24)
    assert not report.failures and report.workers == 2
    cmu = next(s for s in report.slides if "CMU" in s["store"])
    assert cmu["slices"] > 3 and len(cmu["workers"]) == 2  # one slide split over both
    for a, b in zip(alone, spread, strict=True):
        fa, ga = features(a)
        fb, gb = features(b)
        # workers run torch on one thread, this process on two: float sums differ a little
        np.testing.assert_allclose(fb, fa, rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(gb["x"][:], ga["x"][:])
        assert gb.attrs["tilestore"]["complete"] and gb["done"][:].all()
    lines = summary_lines(report)
    assert lines[0].startswith(f"{LITE}: {report.tiles} tiles on 2 worker(s)")
    # the timeline: every slice once, on the worker that ran it, after it was sent, within
    # the cohort's wall; one thread per worker, so a worker's slices never overlap
    timeline = report.timeline
    assert sum(t["tiles"] for t in timeline) == report.tiles
    assert sum(t.get("slices", 1) for t in timeline) == sum(s["slices"] for s in report.slides)
    assert {t["worker"] for t in timeline} == set(report.per_worker)
    for t in timeline:
        assert 0 <= t["sent_s"] <= t["began_s"] + 0.05  # one host: one clock
        assert t["began_s"] + t["seconds"] <= report.wall_s
        assert t["first_batch_s"] is not None and 0 <= t["waiting_s"] <= t["seconds"]
    idle = report.to_json()["idle"]
    for worker, gaps in idle.items():
        spans = sorted((t["began_s"], t["began_s"] + t["seconds"]) for t in timeline
                       if t["worker"] == worker)  # fmt: skip
        assert all(a[1] <= b[0] + 1e-3 for a, b in itertools.pairwise(spans))
        busy = sum(end - start for start, end in spans)
        # busy and idle fill the wall after the set-up, but for the first slices' start
        # before the set-up was counted as over
        after = report.wall_s - report.setup_s
        assert abs(busy + sum(gaps.values()) - after) <= max(report.setup_s - spans[0][0], 0) + 0.01
    assert all(s["ready_s"] >= 0 and s["planned_s"] > 0 for s in report.slides)
    for worker, gaps in idle.items():  # each worker's line says where it waited
        (line,) = [x for x in lines if x.startswith(f"  worker {worker} ")]
        assert line.endswith(
            f", idle {gaps['start']:.1f} s at the start, {gaps['between']:.1f} between "
            f"slices, {gaps['end']:.1f} at the end"
        )
    again = embed_cohort(spread, LITE, client, plan=PLAN, options=OPTIONS)
    assert again.tiles == 0 and sorted(again.skipped_complete) == sorted(map(str, spread))


def test_a_killed_worker_loses_nothing(cohort, client):
    reference = cohort("reference")  # an undisturbed run on the same cluster
    embed_cohort(reference, LITE, client, plan=PLAN, options=OPTIONS, slice_tiles=8)
    paths = cohort("killed")
    result: dict = {}
    run = threading.Thread(
        target=lambda: result.update(
            report=embed_cohort(paths, LITE, client, plan=PLAN, options=OPTIONS, slice_tiles=8)
        )
    )
    run.start()
    deadline = time.monotonic() + 120
    while done_batches(paths) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    busy = [address for address, keys in client.processing().items() if keys]
    assert busy, "no task running to kill"
    pid = client.run(os.getpid, workers=busy[:1])[busy[0]]
    remaining = features(paths[0])[1]["done"].shape[0] - done_batches(paths[:1])
    os.kill(pid, signal.SIGKILL)
    run.join(timeout=300)
    assert remaining > 0, "the run ended before the kill"
    report = result["report"]
    assert not report.failures
    # the loss is reported; a LocalCluster's nanny restarts its worker, nothing is asked
    ((lost),) = report.lost
    assert lost["replacement"] == "its nanny restarts it" and lost["address"] == busy[0]
    assert report.workers_at_end == 2 and not report.ran_short
    for a, b in zip(reference, paths, strict=True):
        fa, _ = features(a)
        fb, group = features(b)
        np.testing.assert_array_equal(fb, fa)
        assert group.attrs["tilestore"]["complete"] and group["done"][:].all()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_lost_workers_kept_tiles_are_counted_once_and_said(cohort, client):
    """A worker dies after writing three batches of a slice (SIGKILL, from its writer): the
    slice's rerun elsewhere keeps those 24 tiles and redoes the rest. The cohort counts every
    tile once (the summary's tiles are the stores', the progress reaches its total) and the
    lost worker's line says what was kept and what redone."""
    paths = cohort("kept")
    options = replace(OPTIONS, shard_tiles=8)  # a batch to a shard: each written at once

    def die_after_three_batches():
        import os as os_
        import signal as signal_

        from tilestore.embeddings.write import EmbeddingWriter

        original = EmbeddingWriter._flush

        def flush(self, shard):
            original(self, shard)
            self.flushed = getattr(self, "flushed", 0) + 1
            if self.flushed == 3 and self.blocks > 4:  # a big slide's slice, mid-way
                os_.kill(os_.getpid(), signal_.SIGKILL)

        EmbeddingWriter._flush = flush

    victim = sorted(client.nthreads())[0]
    client.run(die_after_three_batches, workers=[victim])
    calls = []
    report = embed_cohort(
        paths, LITE, client, plan=PLAN, options=options, slice_tiles=64,
        progress=lambda n, total: calls.append((n, total)),
    )  # fmt: skip
    assert not report.failures
    tiles = sum(features(p)[0].shape[0] for p in paths)
    assert report.tiles == tiles == sum(s["tiles"] for s in report.slides)
    assert sum(n for n, _ in calls) == tiles and {t for _, t in calls} == {tiles}
    # the victim's loss (its nanny's restart was once seen lost again under a loaded CI
    # machine: another event, its slices rerun and counted once all the same)
    lost = next(event for event in report.lost if event["address"] == victim)
    assert all(event["name"] == lost["name"] for event in report.lost)  # no other worker
    # the big slide's slice, killed mid-way; the worker's other slices (in its task, or in
    # another it held: small slices go several to a task) are each kept or redone whole
    slice_ = next(s for s in lost["redone"] if s["kept"] and s["redone"])
    assert slice_["kept"] == 24 and slice_["redone"] == slice_["tiles"] - 24
    assert all(s["kept"] + s["redone"] == s["tiles"] for s in lost["redone"])
    line = next(x for x in summary_lines(report) if "lost after" in x)
    assert (
        f"run again on others: CMU-1-Small-Region.ome.zarr batches {slice_['start']}-"
        f"{slice_['stop'] - 1} (24 tiles kept, {slice_['tiles'] - 24} redone)"
    ) in line


@pytest.mark.parametrize("slice_tiles", [20_000, 8], ids=["one slice", "many slices"])
def test_a_corrupt_slide_is_reported_and_the_cohort_goes_on(cohort, client, slice_tiles):
    """Its other slices (many: cancelled when the first fails) are dropped, the cohort goes on."""
    paths = cohort("corrupt")
    cmu, ihc = paths
    reader = open_slide(cmu).chunks(0)
    for row in range(reader.grid[0]):
        for col in range(reader.grid[1]):
            rewrite_chunk(cmu, lambda _: b"\xff\xd8 not a jpeg", row=row, col=col)
    report = embed_cohort(paths, LITE, client, plan=PLAN, options=OPTIONS, slice_tiles=slice_tiles)
    (failure,) = report.failures
    assert failure["store"] == str(cmu)
    assert "level 0 chunk (" in failure["error"] and "chunk is corrupt" in failure["error"]
    assert failure["error"].endswith("removed, the store is as it was)")
    assert [s["store"] for s in report.slides] == [str(ihc)]
    assert report.exit_code == 3  # some failed, the others complete: as the CLI exits
    assert features(ihc)[1].attrs["tilestore"]["complete"]
    assert not (cmu / "embeddings" / LITE).exists()  # nothing was written: as before the run
    assert not list(cmu.parent.glob(f".{cmu.name}.*.lock"))  # released: a rerun may try again


def test_a_local_gpu_cluster_without_dask_cuda_gives_each_worker_its_own_gpu():
    """Where dask-cuda is not installed, `local_cluster("local-cuda")` starts one nanny per
    GPU, each worker seeing only its own device (as cuda:0): what LocalCUDACluster does."""
    import dask
    from distributed import Client, SpecCluster

    from tilestore.embed.cohort import SCHEDULER, gpu_workers

    with dask.config.set({"distributed.worker.daemon": False}):
        cluster = SpecCluster(gpu_workers(["0", "3"]), scheduler=SCHEDULER)
        try:
            with Client(cluster) as client:
                seen = client.run(lambda: os.environ.get("CUDA_VISIBLE_DEVICES"))
                # asked of the scheduler: the client's cached info is at times without workers
                info = client.sync(client.scheduler.identity, n_workers=-1)
                workers = info["workers"].values()
                names = {w["name"] for w in workers}
                limits = {w["memory_limit"] for w in workers}
        finally:
            cluster.close()
    assert sorted(seen.values()) == ["0", "3"]
    assert names == {"gpu-0", "gpu-3"}
    from distributed.system import MEMORY_LIMIT

    assert limits == {MEMORY_LIMIT // 2}  # the machine's memory shared by the GPUs' workers


# -- slide files made ready on the workers -------------------------------------------------


def test_slide_files_are_converted_on_the_workers_as_one_process_would(cohort, client, tmp_path):
    """The SVS given is converted into `into` on a worker, with its tissue mask: the same
    features, bit for bit, as its store converted beforehand, on the same cluster; a rerun
    reuses the store and skips it as complete."""
    reference = cohort("reference")
    embed_cohort(reference, LITE, client, plan=PLAN, options=OPTIONS, slice_tiles=24)
    svs, ihc = real(SLIDES / CMU), cohort("mixed")[1]
    into = tmp_path / "into"
    report = embed_cohort(
        [svs, ihc], LITE, client, plan=PLAN, options=OPTIONS, into=into, slice_tiles=24
    )
    made = into / "CMU-1-Small-Region.ome.zarr"
    assert not report.failures and {s["store"] for s in report.slides} == {str(made), str(ihc)}
    ((converted),) = report.converted
    assert converted["slide"] == str(svs) and converted["store"] == str(made)
    assert converted["levels"] and converted["seconds"] > 0 and "tissue" in converted
    ((prepared),) = report.prepared
    assert set(prepared["seconds"]) == {"store", "tissue"}  # the mask made, then read
    for a, b in ((reference[0], made), (reference[1], ihc)):
        fa, ga = features(a)
        fb, gb = features(b)
        np.testing.assert_array_equal(fb, fa)
        np.testing.assert_array_equal(gb["x"][:], ga["x"][:])
        assert gb.attrs["tilestore"]["complete"]
    lines = summary_lines(report)
    assert any(line.startswith(f"  converted {svs} -> {made} (") for line in lines)
    again = embed_cohort([svs], LITE, client, plan=PLAN, options=OPTIONS, into=into)
    assert again.converted[0]["reused"] and again.skipped_complete == [str(made)]
    assert again.tiles == 0 and again.exit_code == 0


def test_a_damaged_slide_file_fails_alone_with_its_cause(cohort, client, tmp_path):
    """A truncated SVS fails in its worker's slide process with the reader's cause; the
    store beside it is embedded; nothing that looks like a store is left in `into`."""
    damaged = tmp_path / "damaged.svs"
    damaged.write_bytes(real(SLIDES / CMU).read_bytes()[:300_000])
    ihc = cohort("with-damaged")[1]
    into = tmp_path / "into"
    given = os.path.relpath(damaged)  # as a shell's glob gives it: named so, once
    report = embed_cohort([given, ihc], LITE, client, plan=PLAN, options=OPTIONS, into=into)
    (failure,) = report.failures
    assert failure["store"] == given and "\n" not in failure["error"]
    assert str(damaged) not in failure["error"] and given not in failure["error"]
    assert "truncated or corrupt" in failure["error"]  # the reader's own cause
    assert [s["store"] for s in report.slides] == [str(ihc)] and report.exit_code == 3
    assert not into.exists() or not any(into.iterdir())  # no store, no partial folder


class _Held(WorkerPlugin):
    """The slide process's plugin, standing in: its slide is ready once `flag` exists."""

    name = PREPARER

    def __init__(self, flag: str) -> None:
        self.flag = flag

    def prepare(self, request):
        while not os.path.exists(self.flag):
            time.sleep(0.02)
        return {"store": request["slide"]}


def test_a_slide_made_ready_leaves_its_worker_free_for_slices(client, tmp_path):
    """make_ready leaves the worker's one thread (secede): a task sent to the same worker
    after it runs while the slide is still being made (it is held until the task is over;
    without the secede the task would wait behind it, and the test time out)."""
    flag = tmp_path / "ready"
    client.register_plugin(_Held(str(flag)), name=PREPARER)
    worker = sorted(client.nthreads())[0]
    how = Preparation.of(tmp_path, PLAN)
    request = how.request(real(SLIDES / CMU))
    making = client.submit(make_ready, request, workers=[worker], pure=False)
    after = client.submit(time.monotonic, workers=[worker], pure=False)
    after.result(timeout=60)
    assert not making.done()
    flag.touch()
    assert making.result(timeout=60) == {"store": str(real(SLIDES / CMU))}
    client.register_plugin(SlidesPlugin(), name=PREPARER)  # the real one back


def test_one_file_given_twice_and_two_files_of_one_name(cohort, client, tmp_path):
    """The same SVS under two spellings is taken once; another SVS of the same name waits
    for the first's store to be finished, then finds it there (reused, skipped complete),
    as one process's run would: never two conversions racing for one store."""
    svs = real(SLIDES / CMU)
    twin = tmp_path / "elsewhere" / CMU
    twin.parent.mkdir()
    shutil.copyfile(svs, twin)
    into = tmp_path / "into"
    relative = os.path.relpath(svs)
    report = embed_cohort(
        [svs, relative, twin], LITE, client, plan=PLAN, options=OPTIONS, into=into
    )
    made = into / "CMU-1-Small-Region.ome.zarr"
    assert not report.failures and [s["store"] for s in report.slides] == [str(made)]
    assert sorted(bool(c.get("reused")) for c in report.converted) == [False, True]
    assert report.skipped_complete == [str(made)] and report.exit_code == 0
    # the slide and its store given together: the store taken, the slide after it, reused
    both = embed_cohort([svs, made], LITE, client, plan=PLAN, options=OPTIONS, into=into)
    assert not both.failures and both.exit_code == 0 and both.converted[0]["reused"]


def test_a_bug_in_a_worker_is_one_line():
    from tilestore.embed.cohort import _cause

    bug = RuntimeError(
        "preparing a.svs failed in the worker:\nTraceback (most recent call last):\n"
        '  File "x.py", line 1, in f\nValueError: no good'
    )
    assert _cause(bug, "a.svs") == (
        "RuntimeError: preparing a.svs failed in the worker: ValueError: no good"
    )


@pytest.mark.parametrize("bad", [-1.0, 0.0, 1e-7, float("nan"), 352.8, 1e9, "x"])
def test_a_bad_scan_mpp_is_refused_before_the_cluster_is_asked(bad):
    """The slides' pixel size is the same declaration as the CLI's: refused in one line at
    the call, before any worker loads a model (no client is needed to be refused)."""
    with pytest.raises(TilestoreError, match=r"^scan_mpp=.*: must be a number of um/px from 0.01"):
        embed_cohort([], LITE, None, scan_mpp=bad)


@pytest.mark.parametrize("model", ["timm:no_such_arch", "no-such-model"])
def test_an_unknown_model_is_refused_before_the_cluster_is_asked(model, tmp_path):
    """No client is touched (None would fail on first use), no slide is sent to convert."""
    slide = tmp_path / "a.svs"
    shutil.copy(real(SLIDES / CMU), slide)
    with pytest.raises(TilestoreError, match=r"(timm has no architecture|unknown model)"):
        embed_cohort([slide], model, None, into=tmp_path / "stores", plan=PLAN)
    assert not (tmp_path / "stores").exists()


@pytest.mark.parametrize("bad", [0, -1, float("nan"), 10**9, "x"])
def test_a_bad_cpus_per_worker_is_refused_before_the_cluster_is_asked(bad):
    """The same declaration as convert's --workers: refused in one line at the call, before
    any worker converts a slide or loads a model with it (no client is needed)."""
    with pytest.raises(TilestoreError, match=r"^cpus_per_worker=\S+: "):
        embed_cohort([], LITE, None, cpus_per_worker=bad)
