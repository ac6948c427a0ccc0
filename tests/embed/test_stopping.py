"""A run stopped from outside keeps every batch it computed: "the time limit is near"
(SIGUSR1, `tilestore.stopping`) is taken at the next batch, SIGTERM at once; either way the
shard being filled is written and its batches marked done, and a rerun finishes the store
equal to a run never stopped."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import zarr

from tests.conftest import group_of
from tilestore import stopping
from tilestore.embed.engine import embed
from tilestore.embed.settings import Options
from tilestore.errors import Interrupted
from tilestore.plan import PlanOptions

PLAN = PlanOptions(mpp=0.5, tile=224)
# 8 batches of 4 to a shard: a stop after a few batches leaves a shard partly filled
OPTIONS = Options(device="cpu", batch_size=4, precision="fp32", dtype="float32", shard_tiles=32)
MODEL = "efficientnet-lite0"


@pytest.fixture(autouse=True)
def _nothing_asked():
    stopping.reset()
    yield
    stopping.reset()


def _done_tiles(store) -> tuple[int, int]:
    group = zarr.open_group(store / group_of(store, MODEL), mode="r")
    n = group["features"].shape[0]
    done = np.flatnonzero(group["done"][:])
    return sum(min(4, n - b * 4) for b in done), n


def _counted(after: int, stop):
    """A progress callback counting the tiles written; once `after` are, `stop()`."""
    written = []

    def progress(n: int, total: int) -> None:
        written.append(n)
        if sum(written) >= after and len(written) == after // 4:
            stop()

    return written, progress


def test_the_time_limit_signal_stops_at_a_batch_and_keeps_the_partial_shard(store, lite, tmp_path):
    stopped, reference = store(into=tmp_path / "stopped"), store(into=tmp_path / "reference")
    embed([reference], lite, plan=PLAN, options=OPTIONS)
    # asked from the writer thread, as a signal handler's `ask_stop` would ask it
    written, progress = _counted(12, lambda: stopping.ask_stop(signal.SIGUSR1))
    with stopping.at_batches(), pytest.raises(Interrupted, match=r"^SIGUSR1$") as raised:
        embed([stopped], lite, plan=PLAN, options=OPTIONS, progress=progress)
    done, n = _done_tiles(stopped)
    assert raised.value.report.kept == {str(stopped): done}  # the run's report says it too
    assert done == sum(written)  # every batch written was kept, the partial shard with them
    assert 12 <= done < 32 < n  # the first shard, partly filled
    (line,) = stopping.kept_at_stop()
    assert line.startswith(f"{done} tiles embedded by this run are written and marked done")
    assert f"{stopped}: {done // 4} of {-(-n // 4)} batches of " in line
    stopping.reset()
    again = embed([stopped], lite, plan=PLAN, options=OPTIONS)
    assert again.tiles == n - done and again.slides[0]["skipped_done"] == done
    got = zarr.open_group(stopped / group_of(stopped, MODEL), mode="r")
    want = zarr.open_group(reference / group_of(reference, MODEL), mode="r")
    assert got.attrs["tilestore"]["complete"]
    np.testing.assert_array_equal(got["features"][:], want["features"][:])


def test_sigterm_stops_at_once_and_still_writes_the_partial_shard(store, lite, tmp_path):
    path = store(into=tmp_path / "terminated")

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        written, progress = _counted(12, lambda: os.kill(os.getpid(), signal.SIGTERM))
        with pytest.raises(KeyboardInterrupt):
            embed([path], lite, plan=PLAN, options=OPTIONS, progress=progress)
    finally:
        signal.signal(signal.SIGTERM, previous)
    done, n = _done_tiles(path)
    assert done == sum(written) and 12 <= done < 32 < n
    assert not stopping.kept_at_stop()  # said as an interruption, not a stop at a batch


def test_a_stop_asked_outside_a_run_is_not_taken_at_a_batch():
    assert not stopping.ask_stop(signal.SIGUSR1)  # no run: the command interrupts at once
    with stopping.at_batches():
        assert stopping.ask_stop(signal.SIGUSR1)
