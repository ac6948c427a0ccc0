"""Each slide's store work in a store process: the store opened, its plan loaded or made, its
embeddings group made (or resumed) under its lock, its batches written and the slide
finished, while the run's own process reads its pixels and drives the GPU.

A store's writes go through zarr, whose calls each cost a millisecond or more of Python on
its one event-loop thread: in the run's process they held the GIL the GPU loop needs, some
75 ms a slide of 45 tiles (bench/RESULTS.md, issue 68), which a cohort of small slides paid
between batches. Here each slide is given to one of a few `python -m
tilestore.embed.storeside` processes (`StoreProcesses`), which opens it and keeps its
`EmbeddingWriter`; the run gets a `Job` whose writer (`RemoteWriter`) sends that process the
slide's rows and its finish. A process answers its calls side by side on threads
(`tilestore.workers.Channel`), so a slide's batch is never queued behind another slide's
opening. The processes import no torch.

A store process that dies (killed: out of memory) fails the slides it held, each with the
batches it had written (done and kept: a rerun resumes them); the next slides go to a new
one. A stop (Ctrl-C, SIGTERM) is the run's to make: the processes ignore it and the run
abandons its slides through them, keeping what is written.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from tilestore import workers
from tilestore.embed.models import ModelSpec
from tilestore.embed.opening import Opening, PlanChoice, Prepared, open_for_run
from tilestore.embed.preflight import rgb_input
from tilestore.embed.readout import Wanted, read_out
from tilestore.embeddings import EmbeddingWriter, RunIdentity
from tilestore.errors import ChunkError, StoreError, TilestoreWarning
from tilestore.plan import TilePlan
from tilestore.reading import Slide, open_slide
from tilestore.workers import Channel, WorkerGone

# the calls a store process answers at once: a slide's rows are written while others open
SIDE_THREADS = 4
# the most rows' bytes of one batch a store process is sent (larger: tokens, written in the
# run's process as before: a pipe carries a batch of ViT-S token grids, 38 MB, too slowly)
ROWS_BYTES = 4 * 2**20


@dataclass(frozen=True)
class Request:
    """What a run opens a store with (the arguments of `open_for_run`)."""

    store: str
    spec: ModelSpec
    plan: PlanChoice
    identity: RunIdentity
    overwrite: bool
    max_tiles: int | None
    any_scale: bool
    break_lock: bool
    run: str = ""  # the run's jobs (`store_jobs`): a halt of theirs stops this opening


class StoreProcesses:
    """`count` store processes, all started at once (each takes a second or two to import
    zarr: started as slides came, the first slides of a run waited for them in turn) and
    kept between runs, one started again in place of one that died; each slide goes to the
    one holding the fewest."""

    def __init__(self, count: int, read_out: Wanted | None = None) -> None:
        self.count = max(1, count)
        self.read_out = read_out  # what of each slide's reading is made there (`ReadOut`)
        self._held: dict[Channel, int] = {}  # slides each holds (opening or open)
        self._keys = itertools.count()
        self._lock = threading.Lock()
        self._closed = False
        self._cwd = os.getcwd()  # where they run: a store named relatively is found there
        self._channels = [self._started() for _ in range(self.count)]

    def _started(self) -> Channel:
        return Channel("tilestore.embed.storeside", keep_on_stop=True)

    def open(self, request: Request, go_on: Callable[[], None]) -> Opening:
        """Open `request.store` in a store process (`open_for_run` there); the opening's
        writer is a `RemoteWriter`, its slide opened here for reading. AlreadyComplete or
        the store's TilestoreError as `open_for_run` raises them; a store process that dies
        meanwhile fails this store alone (StoreError). `go_on` is called before and after,
        and raises to stop. Whatever fails here once the store is open there (its slide
        unreadable here, a warning the filters make an error, the stop) releases it there."""
        go_on()
        channel, key = self._take()
        try:
            found, error, said = channel(("open", key, request, self.read_out))
        except WorkerGone:
            self._release(channel)
            raise StoreError(
                f"{request.store}: the store process opening it died "
                f"(exit code {channel.exit_code})"
            ) from None
        except BaseException:  # a reply that does not read here: let go of it there
            self._let_go(channel, key)
            raise
        if error is not None:  # a result that did not pickle there may have been kept
            self._let_go(channel, key)
            _said(said)
            raise error
        writer = RemoteWriter(self, channel, key, request.store, found)
        try:
            _said(said)
            slide = found["slide"] or open_slide(request.store)  # in place: opened here
            ready = replace(
                found["ready"], slide=slide, pixels=rgb_input(slide, request.identity.channels)
            )
            go_on()
        except BaseException:
            writer.abandon()
            raise
        return Opening(
            Path(request.store),
            ready,
            writer,
            found["todo"],
            found["left"],
            found["seconds"],
            found["read_out"],
        )

    def halt(self, run: str) -> None:
        """The run's jobs have stopped: each store process stops the openings of theirs at
        their next step (each releasing what it took), as the run's threads stop theirs."""
        with self._lock:
            channels = [c for c in self._channels if c.alive]
        for channel in channels:
            with contextlib.suppress(WorkerGone):
                channel(("halt", None, run))

    def _take(self) -> tuple[Channel, int]:
        """The store process to give a slide: the one holding the fewest (a new one in place
        of each that died)."""
        with self._lock:
            if self._closed:
                raise StoreError("the store processes are closed")
            if os.getcwd() != self._cwd and not any(self._held.values()):
                for channel in self._channels:  # paths as given are read where they started:
                    channel.closing()  # new ones, in the folder the caller moved to
                self._channels, self._cwd = [], os.getcwd()
            live = [c for c in self._channels if c.alive]
            self._channels = live + [self._started() for _ in range(self.count - len(live))]
            channel = min(self._channels, key=lambda c: self._held.get(c, 0))
            self._held[channel] = self._held.get(channel, 0) + 1
            return channel, next(self._keys)

    def _let_go(self, channel: Channel, key: int) -> None:
        """Whatever the store process holds under `key` abandoned there (nothing, where its
        opening failed: the call's own error is not ours to say), and its count here."""
        with contextlib.suppress(WorkerGone):
            channel(("abandon", key))
        self._release(channel)

    def _release(self, channel: Channel) -> None:
        with self._lock:
            self._held[channel] = max(0, self._held.get(channel, 0) - 1)

    def close(self) -> None:
        """Stop the processes (once their calls in hand are answered), all at once."""
        with self._lock:
            channels, self._channels, self._closed = self._channels, [], True
        for channel in channels:
            channel.closing()
        for channel in channels:
            channel.close()


class RemoteWriter:
    """A slide's `EmbeddingWriter` in a store process, as the run uses it: its rows written,
    its finish and its abandoning, each a call there (in order: the run's lanes make them
    one at a time)."""

    def __init__(
        self,
        processes: StoreProcesses,
        channel: Channel,
        key: int,
        store: str,
        opened: dict[str, Any],
    ) -> None:
        self._processes, self._channel, self._key, self._store = processes, channel, key, store
        self.path: str = opened["path"]
        self.took_over: str | None = opened["took_over"]
        self._quality: dict[str, Any] | None = None
        self._tiles_done = 0
        self._released = False

    def create(self, maker: Callable[..., Any] | None = None) -> None:
        """Made already, in the store process, when the slide was opened."""

    def write(self, block: int, features: np.ndarray) -> None:
        self._call("write", block, np.ascontiguousarray(features))

    def finish(self, summary: dict[str, Any]) -> None:
        """Finish it there; where that fails (a full disk, its lock taken over), it is still
        the run's to abandon, which says what is kept."""
        self._quality = self._call("finish", summary)
        self._release()

    def quality_summary(self) -> dict[str, Any] | None:
        return self._quality

    def abandon(self) -> str:
        if self._released:
            return ""
        try:
            said, self._tiles_done = self._call("abandon")
        except StoreError:
            if self._channel.alive:
                raise
            said = "the batches whose shards were written are kept: rerun to resume"  # it died
        finally:
            self._release()
        return said

    def tiles_done(self) -> int:
        return self._tiles_done

    def _call(self, step: str, *args: Any) -> Any:
        try:
            result, error, said = self._channel((step, self._key, *args))
        except WorkerGone:
            raise StoreError(
                f"{self._store}: the store process writing {self.path} died (exit code "
                f"{self._channel.exit_code})"
            ) from None
        _said(said)
        if error is not None:
            raise error
        return result

    def _release(self) -> None:
        if not self._released:
            self._released = True
            self._processes._release(self._channel)


def _said(said: list[tuple[type[Warning], str]]) -> None:
    """The warnings a store process's call made, said here (as the run's own: the command
    shows them as it shows every warning, the filters here decide)."""
    for category, message in said:
        warnings.warn(message, category, stacklevel=3)


# -- the store process -------------------------------------------------------------------------


class Side:
    """A store process's slides: each opened, written, finished or abandoned as its run asks
    (`answer`), by the key the run gave it."""

    def __init__(self, caller: int | None = None) -> None:
        self.caller = caller  # the run's pid: the locks taken here are gone with it too
        self.writers: dict[int, EmbeddingWriter] = {}
        self._lock = threading.Lock()
        self._calls = threading.local()  # the warnings of the call on each thread
        self.halted: set[str] = set()  # the runs whose openings stop (`StoreProcesses.halt`)

    def answer(self, request: dict[str, Any]) -> str:
        """The reply to one call: its result, what it raised and the warnings it made
        (`_said` says them in the run's process)."""
        step, key, *args = workers.call_of(request)
        self._calls.said = said = []
        result, error = None, None
        try:
            result = getattr(self, f"_{step}")(key, *args)
        except Exception as exc:
            error = exc if _pickles(exc) else StoreError(f"{type(exc).__name__}: {exc}")
        finally:
            self._calls.said = None
        return workers.packed_reply(((result, error, said), None))

    def show_warning(self, message, category, filename, lineno, file=None, line=None) -> None:
        """`warnings.showwarning` here: a call's warnings kept for its reply; any other
        shown on stderr, as Python shows it."""
        said = getattr(self._calls, "said", None)
        if said is None:
            sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))
            return
        said.append((category, str(message)))

    def _halt(self, key: None, run: str) -> None:
        self.halted.add(run)

    def _open(self, key: int, request: Request, wanted: Wanted | None = None) -> dict[str, Any]:
        def go_on() -> None:
            if request.run in self.halted:
                raise StoreError(f"{request.store}: not opened: the run stopped")

        opening = open_for_run(
            request.store,
            request.spec,
            request.plan,
            request.identity,
            overwrite=request.overwrite,
            max_tiles=request.max_tiles,
            any_scale=request.any_scale,
            break_lock=request.break_lock,
            lock_for=self.caller,
            go_on=go_on,
        )
        ready = opening.ready
        try:
            slide = _shipped(ready.slide, ready.plan)
            # a slide read in place is opened again in the run: its chunks located there
            wanted = replace(wanted, located=False) if slide is None and wanted else wanted
            made = read_out(ready.pixels, ready.plan, opening.todo, wanted)
        except BaseException:
            opening.abandon()  # its lock released, a group never written removed
            raise
        with self._lock:
            self.writers[key] = opening.writer
        return {
            # the plan and how it is read travel, and the slide opened here (`_shipped`)
            "ready": Prepared(ready.store, None, None, ready.plan, ready.uid, ready.reading),
            "slide": slide,
            "todo": opening.todo,
            "left": opening.left,
            "seconds": opening.seconds,
            "read_out": made,
            "path": opening.writer.path,
            "took_over": opening.writer.took_over,
        }

    def _write(self, key: int, block: int, rows: np.ndarray) -> None:
        self.writers[key].write(block, rows)

    def _finish(self, key: int, summary: dict[str, Any]) -> dict[str, Any] | None:
        writer = self.writers[key]
        writer.finish(summary)  # failing, it stays: the run abandons it, which says what is kept
        self._pop(key)
        return writer.quality_summary()

    def _abandon(self, key: int) -> tuple[str, int]:
        writer = self._pop(key)
        said = writer.abandon()
        return said, writer.tiles_done()

    def _pop(self, key: int) -> EmbeddingWriter:
        with self._lock:
            return self.writers.pop(key)


def _shipped(slide: Slide, plan: TilePlan) -> Slide | None:
    """The slide as the run reads its pixels, opened here, the positions of the plan's level
    loaded: a store's metadata read and parsed in the run's process cost a small slide
    some 4 ms of the GIL its GPU loop needs, its positions 1 ms more (bench/RESULTS.md,
    issue 68); a slide travels pickled in a tenth of that. None for a slide read in place
    (its level readers hold the slide file open): the run opens it itself."""
    if slide.record.source.sidecar:
        return None
    with contextlib.suppress(ChunkError):  # damaged: found where the run reads, as before
        slide.chunks(plan.spec.level).locations([])
    return slide


def _pickles(error: BaseException) -> bool:
    import pickle

    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return False
    return True


def main() -> None:
    """`python -m tilestore.embed.storeside`: serve a run's calls, side by side."""
    import signal

    if os.environ.pop(workers.KEEP_ON_STOP, None):
        for stop in (signal.SIGINT, signal.SIGTERM):  # the run's to make (see the module)
            signal.signal(stop, signal.SIG_IGN)
    caller = os.environ.get(workers.CALLER)  # (`serve` takes it from the environment)
    side = Side(int(caller) if caller else None)
    # ours said each time in the run's process, which filters them as it filters its own
    warnings.simplefilter("always", TilestoreWarning)
    warnings.showwarning = side.show_warning
    try:
        workers.serve(side.answer, threads=SIDE_THREADS)
    finally:  # the run closed the process (or is gone): the locks still held are released
        for writer in list(side.writers.values()):
            writer.abandon()
        sys.stdout.flush()


if __name__ == "__main__":
    main()
