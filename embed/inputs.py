"""What `embed` is given: stores as they are, and slide files, made ready on the way in.

A slide file (SVS, NDPI, DICOM, ...) becomes a store in the staging folder first, by the
same conversion as `tilestore convert` (JPEG tiles copied where they can be), or, read in
place, gets its sidecar (`tilestore.conversion.sidecar`); then the tissue mask its plan reads is
computed and stored. All of it runs in worker processes (`python -m tilestore.embed.inputs`:
one, or `at_once` for a cohort of small slides), a slide ahead of the engine, started when
the Stager is made, which the command does before it imports torch: the first slides are
converted while the embedding process imports torch and loads the model, the next ones
while the GPU embeds those before, and the workers share no GIL with the engine's threads.
A slide whose store is already there (a complete store of a source with the same name and
size: an earlier run, or one killed after converting) is not converted again.

The worker is a plain `python -m` process reading one JSON request per line, as the decoder
processes are (`tilestore.embed.procdecode`): it never imports the caller's main module, nor torch.
A worker that dies (a decoder library crashing on a damaged file) fails that slide, with
the cause; a new worker takes the slides after it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Annotated, Any, Literal
from urllib.parse import urlsplit

import tilestore.errors
from tilestore import workers
from tilestore.cpus import usable_cpus
from tilestore.errors import (
    OptionError,
    SlideError,
    StoreError,
    TilestoreError,
    TilestoreWarning,
)
from tilestore.format.store import is_store, one_store_each, store_name
from tilestore.options import Opt
from tilestore.plan import PlanOptions
from tilestore.reading.resolution import in_scan_terms
from tilestore.sources.remote import check_urls, given, is_url, slide_file
from tilestore.urls import named, written_here

SlidesAtOnce = Annotated[
    int | Literal["auto"],
    Opt(
        "Slide files made ready at once (--into, --in-place), each in a worker process of its "
        "own ('auto': one per 2 CPUs, no more than the slides): for a cohort of small slides "
        "(biopsies, TMA cores), which one process converting them in turn would slow.",
        low=1,
        high=1024,
        metavar="N|auto",
    ),
]


@dataclass(frozen=True)
class Staged:
    """One input as the engine takes it: a store, or why it could not become one."""

    given: Path | str  # a URL as `shown`: no secret of it in a message or report
    store: Path | None
    converted: dict | None = None  # {slide, store, seconds, levels: "copy"/"re-encode"...}
    error: TilestoreError | None = None
    warnings: tuple[str, ...] = ()  # what making it ready warned of (no pixel size...)
    # what making it ready took, in seconds: "store" (converted, reused or its sidecar
    # made or opened), "tissue" (the mask read or computed); None for a store as given
    seconds: dict[str, float] | None = None


def as_staged(stores: Iterable[str | os.PathLike] | Stager) -> Iterable[Staged]:
    """Staged items for a Stager, or for a list of store paths (taken as they are)."""
    if isinstance(stores, Stager):
        return stores
    return [Staged(given(s), Path(s)) for s in stores]


def tissue_wanted(plan: str | PlanOptions | None) -> str | None:
    """The tissue method that a plan of this choice makes a missing mask with, or None
    where it reads no mask: a stored plan's name, or options with min_tissue 0. (For the
    choice None, the worker also skips a store that holds exactly one plan: that is used.)"""
    if isinstance(plan, str):
        return None
    options = plan or PlanOptions()
    return options.tissue_method if options.effective_min_tissue > 0 else None


@dataclass(frozen=True)
class Preparation:
    """How slide files are made ready, decided once for a run (the Stager's worker, and each
    Dask worker of a cohort, take the same requests): converted into `into`, or with in_place
    read where they are through a sidecar (in `sidecars`, else beside each slide); scan_mpp
    where the file records none (override_mpp: over what it records); the tissue mask their
    plan reads."""

    into: Path | None = None
    in_place: bool = False
    sidecars: str | None = None
    scan_mpp: float | None = None
    tissue: str | None = None
    only_plan_will_do: bool = True  # the plan choice None: a store's one plan needs no mask
    cpus: int | None = None  # a conversion's threads (None: the CPUs the process may use)
    override_mpp: bool = False  # scan_mpp replaces the size a file states (recorded so)

    @classmethod
    def of(
        cls,
        into: str | os.PathLike | None,
        plan: str | PlanOptions | None,
        *,
        in_place: bool = False,
        sidecars: str | os.PathLike | None = None,
        scan_mpp: float | None = None,
        cpus: int | None = None,
        override_mpp: bool = False,
    ) -> Preparation:
        return cls(
            None if into is None or in_place else written_here(into, "into"),
            in_place,
            None if sidecars is None else str(written_here(sidecars, "sidecars")),
            scan_mpp,
            tissue_wanted(plan),
            plan is None,
            cpus,
            override_mpp,
        )

    def wants(self, path: Path | str) -> bool:
        """A slide file (or a slide's URL) with somewhere to go; a store, a missing path, or
        a slide with neither `into` nor in_place is taken as a store (and fails as one where
        it is not)."""
        somewhere = self.in_place or self.into is not None
        return somewhere and (is_url(path) or (not is_store(path) and Path(path).exists()))

    def target(self, path: Path | str) -> Path | None:
        """The store a slide file is converted into (None: read in place)."""
        return None if self.into is None else self.into / store_name(path)

    def destination(self, path: Path | str) -> Path | str:
        """The store an input's embeddings go into: a store itself, the store a slide file
        is converted into, or its sidecar."""
        if not self.wants(path):
            return path
        if self.into is not None:
            return self.into / store_name(path)
        from tilestore.reading import sidecar_for

        return sidecar_for(path, self.sidecars)

    def once_each(self, inputs: Iterable[str | os.PathLike]) -> list[Path | str]:
        """The inputs, one given again taken once; two bound for one store refused
        (`one_store_each`). A URL is kept as text (`given`)."""
        paths = [given(p) for p in inputs]
        return [paths[i] for i in one_store_each((p, None, self.destination(p)) for p in paths)]

    def request(self, path: Path | str) -> dict[str, Any]:
        """The worker's request for one slide (`_answer` reads it)."""
        return {
            "slide": str(path),
            "into": None if self.into is None else str(self.into),
            "sidecars": self.sidecars,
            "scan_mpp": self.scan_mpp,
            "override_mpp": self.override_mpp,
            "tissue": self.tissue,
            "only_plan_will_do": self.only_plan_will_do,
            "cpus": self.cpus,
        }


class Stager:
    """Each input in order as a `Staged` store: stores as given; slide files made ready as
    `Preparation` says, in `at_once` worker processes, `ahead` slides beyond them before
    they are asked for. The first slides start when the Stager is made, so they overlap the
    caller's imports and the model's loading. A slide file with neither `into` nor in_place
    fails as an input that is not a store.

    at_once: slides made ready at once, each worker's conversions given an equal share of
    the CPUs (a cohort of small slides: a biopsy converts in half a second on one CPU,
    which one worker would make the run's pace). A worker answers in the order it was
    asked, and the slides are yielded in the order given."""

    def __init__(
        self,
        inputs: list[str | os.PathLike],
        into: str | os.PathLike | None = None,
        plan: str | PlanOptions | None = None,
        *,
        in_place: bool = False,
        sidecars: str | os.PathLike | None = None,
        scan_mpp: float | None = None,
        override_mpp: bool = False,
        ahead: int = 1,
        at_once: int | Literal["auto"] = 1,
    ) -> None:
        paths = [given(p) for p in inputs]  # as given: messages name them so
        self._queue = iter(paths)
        self._how = Preparation.of(
            into,
            plan,
            in_place=in_place,
            sidecars=sidecars,
            scan_mpp=scan_mpp,
            override_mpp=override_mpp,
        )
        paths = self._how.once_each(paths)
        self._queue = iter(paths)
        if at_once != 1:
            from tilestore.conversion.many import slides_at_once

            at_once = slides_at_once(sum(map(self._how.wants, paths)), at_once)
            self._how = replace(self._how, cpus=max(1, usable_cpus() // at_once))
        self._ahead = ahead
        # (input, the worker it was sent to; None: taken as a store)
        self._pending: list[tuple[Path | str, int | None]] = []
        self._workers: list[SlideWorker | None] = [None] * int(at_once)
        self._sent, self._last = 0, [0] * int(at_once)  # requests sent; each worker's last
        self._refill()

    def _refill(self) -> None:
        sent = sum(worker is not None for _, worker in self._pending)
        while sent < self._ahead + len(self._workers):
            path = next(self._queue, None)
            if path is None:
                return
            worker = self._send(path) if self._how.wants(path) else None
            sent += worker is not None
            self._pending.append((path, worker))

    def _send(self, path: Path | str, index: int | None = None) -> int:
        """Ask a worker to make `path` ready (the one with the fewest slides in hand, or
        `index`); which it was."""
        if index is None:  # ties: the one asked longest ago (else the first gets two in turn)
            asked = Counter(worker for _, worker in self._pending if worker is not None)
            index = min(range(len(self._workers)), key=lambda i: (asked[i], self._last[i]))
        self._sent += 1
        self._last[index] = self._sent
        worker = self._workers[index]
        if worker is None:
            worker = self._workers[index] = SlideWorker()
        worker.send(self._how.request(path))
        return index

    def __iter__(self) -> Iterator[Staged]:
        try:
            while self._pending:
                self._refill()  # slides are made ready while this one is embedded
                path, index = self._pending.pop(0)
                if index is not None:
                    yield self._reply(path, index)
                elif is_url(path):  # a slide's URL with nowhere to go
                    yield Staged(named(path), None, error=OptionError(
                        f"{named(path)}: a slide named by URL is converted into --into DIR "
                        "first; give it"))  # fmt: skip
                else:
                    yield Staged(path, Path(path))
        finally:
            self.close()

    def _reply(self, path: Path | str, index: int) -> Staged:
        worker = self._workers[index]
        assert worker is not None
        reply = worker.receive()
        if reply is None:  # the worker died on this slide: fail it, go on with a new one
            code = worker.close()
            self._workers[index] = None
            for later, asked in self._pending:
                if asked == index:  # asked of the dead one: asked again, in their order
                    self._send(later, index)
            return staged_from(path, None, code)
        return staged_from(path, reply)

    def close(self) -> None:
        """Stop. A slide still being made ready (the run ended early: an error, an
        interrupt) is abandoned: its worker is stopped, and a conversion stopped leaves only
        its hidden partial folder, which the next conversion there clears
        (`tilestore.format.leftovers`)."""
        self._pending.clear()
        self._queue = iter(())
        for index, worker in enumerate(self._workers):
            if worker is not None:
                worker.close()
                self._workers[index] = None


# a worker's exit code where a stop signal ended it (killed by it, or `serve`'s exit 130)
STOPPED = {-signal.SIGTERM: "SIGTERM", -signal.SIGINT: "SIGINT", 130: "SIGINT"}


def staged_from(path: Path | str, reply: dict[str, Any] | None, code: int = 0) -> Staged:
    """A worker's reply for the slide `path` as a Staged input; reply None: the worker died
    on it (`code`: its exit code, negative for a signal). A bug's traceback is raised. A
    URL is named as `shown` (a signed URL's query is its secret)."""
    if is_url(path):  # as shown; a path stays the Path given
        path = named(path)
    if reply is None:
        if code in STOPPED:  # SLURM's SIGTERM or a Ctrl-C reached it too: not the slide's
            return Staged(path, None, error=SlideError(
                f"{path}: the process preparing it was stopped ({STOPPED[code]}) before it "
                "was ready: the same command makes it ready again"))  # fmt: skip
        cause = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        return Staged(
            path,
            None,
            error=SlideError(
                f"{path}: the process preparing it died ({cause}): a damaged or unsupported file?"
            ),
        )
    if reply.get("bug"):
        raise RuntimeError(f"preparing {path} failed in the worker:\n{reply['bug']}")
    if reply.get("error"):
        kind, message = reply["error"]
        error = getattr(tilestore.errors, kind, TilestoreError)(message)
        return Staged(path, None, error=error)
    return Staged(
        path,
        Path(reply["store"]),
        reply.get("converted"),
        warnings=tuple(reply.get("warnings", ())),
        seconds=reply.get("seconds"),
    )


class SlideWorker:
    """The `python -m tilestore.embed.inputs` process: one JSON request a line in, one reply
    out (a Stager's, or a Dask worker's in a cohort: `tilestore.embed.daskworker`)."""

    def __init__(self) -> None:
        self._proc = workers.start("tilestore.embed.inputs")
        self._in_flight = 0  # requests sent, not answered

    def send(self, request: dict[str, Any]) -> None:
        assert self._proc.stdin is not None
        self._in_flight += 1
        with contextlib.suppress(BrokenPipeError):  # dead: its next reply says so
            self._proc.stdin.write(json.dumps(request) + "\n")

    def receive(self) -> dict[str, Any] | None:
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        self._in_flight -= 1
        return json.loads(line) if line else None

    def kill(self) -> None:
        """Stop it at once, from another thread than the one waiting for its reply (which
        then reads the end of its replies)."""
        self._proc.kill()

    def close(self) -> int:
        """Let it exit, stopped first where it still has work in hand; its exit code."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        if self._in_flight > 0:
            self._proc.terminate()
        with contextlib.suppress(BrokenPipeError):
            self._proc.stdin.close()
        code = self._proc.wait()
        self._proc.stdout.close()
        return code


def prepare(
    slide: Path | str,
    into: Path | None,
    tissue: str | None,
    only_plan_will_do: bool,
    sidecars: Path | None = None,
    scan_mpp: float | None = None,
    cpus: int | None = None,
    override_mpp: bool = False,
):
    """Make one slide ready (in the worker): its store, converted or reused (into a folder)
    or its sidecar (into None: in place, in `sidecars` or beside it), and the tissue mask its
    plan reads; scan_mpp: the slide's level-0 um/px where its file records none (with
    override_mpp: over what it records, `convert`'s rule); cpus: the conversion's threads.
    Returns (store, converted, seconds): seconds is what each step took ("store", "tissue")."""
    from tilestore.conversion import open_in_place
    from tilestore.plan import plan_tissue, uses_stored_plan
    from tilestore.reading import open_slide, sidecar_for

    converted = None
    started = time.perf_counter()
    check_urls([slide], in_place=into is None, look=False)  # a URL is converted, not read in place
    if into is None:  # made the first time, its mask made beside it
        opened = open_in_place(
            slide, sidecars, mpp=scan_mpp, override_mpp=override_mpp, tissue=tissue
        )
        store = sidecar_for(slide, sidecars)
    else:
        store, converted = _convert(slide, into, scan_mpp, tissue, cpus, override_mpp)
        opened = open_slide(store)
    seconds = {"store": round(time.perf_counter() - started, 3)}
    if tissue and not (only_plan_will_do and uses_stored_plan(opened, None)):
        started = time.perf_counter()
        _, note = plan_tissue(opened, PlanOptions(tissue_method=tissue))
        seconds["tissue"] = round(time.perf_counter() - started, 3)
        if note and converted is not None:
            converted["tissue"] = note
    return store, converted, seconds


def _convert(
    slide: Path | str,
    into: Path,
    scan_mpp: float | None,
    tissue: str | None,
    cpus: int | None = None,
    override_mpp: bool = False,
) -> tuple[Path, dict]:
    """The slide's store in `into`: one there reused, else converted (with its tissue mask
    made beside the conversion where a method is given)."""
    from tilestore.conversion.converter import convert

    target = into / store_name(slide)
    if is_store(target):
        _check_reusable(target, slide, scan_mpp, override_mpp)
        return target, {"slide": named(slide), "store": str(target), "reused": True}
    if target.exists() or target.is_symlink():  # the user's: never replaced, nor offered to be
        kind = "a folder" if target.is_dir() else "a file"
        raise StoreError(
            f"{target}: {kind} that is not a tilestore store is where {_name(slide)}'s store goes; "
            "move it or choose another --into folder"
        )
    started = time.perf_counter()
    report = convert(
        slide, target, mpp=scan_mpp, override_mpp=override_mpp, tissue=tissue, workers=cpus
    )
    paths = sorted({level.write for level in report.levels})
    return report.store, {
        "slide": named(slide),
        "store": str(report.store),
        "seconds": round(time.perf_counter() - started, 3),
        "codec": report.codec,
        "levels": paths,
        **({"tissue": report.tissue} if report.tissue else {}),
    }


def _check_reusable(
    target: Path, slide: Path | str, scan_mpp: float | None, override_mpp: bool = False
) -> None:
    """A store already at the target may stand for the slide only if it is complete, was
    made with the pixel size asked (scan_mpp, and an override only where override_mpp asks
    the same: `check_mpp`) and from this very slide: a file of the same name and size whose
    SHA-256, read from the slide now, is the one recorded. The time is never trusted: a copy
    that kept it (cp -p, rsync -t, tar) may hold other bytes. Anything else is an error,
    never reused: another slide under the same name would give its embeddings silently."""
    from tilestore.conversion import check_mpp
    from tilestore.reading import open_slide
    from tilestore.sources import open_source

    opened = open_slide(target)  # StoreError if incomplete
    check_mpp(opened, scan_mpp, target, override_mpp)
    recorded = opened.record.source
    url, name, slide = slide, _name(slide), named(slide)  # a URL: its staged copy is read
    with slide_file(url) as local, open_source(local) as source:
        size = source.size()
        if recorded.name != name:
            made = f"already holds another slide ({recorded.name}, {recorded.size} bytes)"
        elif recorded.size != size:
            made = f"made from another file of this name ({recorded.size} bytes; {slide}: {size})"
        elif recorded.sha256 is None:
            made = (
                "made before tilestore recorded a slide's SHA-256, so whether it was made from "
                f"{slide} cannot be told; give the store itself instead of the slide if it is "
                "that slide's, else remove it to convert the slide again"
            )
            raise StoreError(f"{target}: {made}")
        elif recorded.sha256 == source.sha256():
            return
        else:
            made = (
                f"made from another file of the same name and size ({recorded.name}, {size} "
                f"bytes) whose SHA-256 differs from {slide}'s (its bytes changed, whatever its "
                "time says)"
            )
    raise StoreError(f"{target}: {made}; move it or choose another --into folder")


def _name(slide: Path | str) -> str:
    """A slide's file name (a URL's path's last step)."""
    return Path(urlsplit(str(slide)).path).name if is_url(slide) else Path(slide).name


def _answer(request: dict[str, Any]) -> str:
    """One slide made ready: its store, or its error by kind, or a bug's traceback."""
    into, sidecars = request["into"], request.get("sidecars")
    try:
        with warnings.catch_warnings(record=True) as said:  # for the run's report, not stderr
            warnings.simplefilter("always", TilestoreWarning)
            store, converted, seconds = prepare(
                given(request["slide"]),
                None if into is None else Path(into),
                request["tissue"],
                request["only_plan_will_do"],
                None if sidecars is None else Path(sidecars),
                request.get("scan_mpp"),
                request.get("cpus"),
                request.get("override_mpp", False),
            )
        reply: dict[str, Any] = {
            "store": str(store),
            "converted": converted,
            "seconds": seconds,
            # convert's mpp is the run's scan_mpp: its advice put in the run's terms
            "warnings": [
                in_scan_terms(str(w.message))
                for w in said
                if issubclass(w.category, TilestoreWarning)
            ],
        }
    except TilestoreError as exc:
        reply = {"error": [type(exc).__name__, in_scan_terms(str(exc))]}
    except Exception:  # a bug: the caller raises it with this traceback
        reply = {"bug": traceback.format_exc()}
    return json.dumps(reply)


def _serve(requests: IO[str] | None = None, replies: IO[str] | None = None) -> None:
    workers.serve(_answer, requests, replies)


if __name__ == "__main__":
    _serve()
