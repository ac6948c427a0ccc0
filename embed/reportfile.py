"""A run's report as a file (`--report`, `report_path=`): one function writes every one of
them (one process, an array task, Dask, an empty share, every store skipped, a run
interrupted or refused), whole or not at all, and says how the run ended.

Light on purpose (no torch): an empty share or an all-skipped task writes its report
before anything imports torch. A report that cannot be written is a warning naming the
report's path and the cause, never the run's failure: what the run finished stays
finished, and its exit status says so."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import secrets
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tilestore.embed.outcome import BAD_INPUT, outcome
from tilestore.errors import TilestoreWarning

NAMED = 5  # the most stores an interrupted line names


def write_report(path: str | os.PathLike, data: dict[str, Any]) -> bool:
    """Write `data` as JSON at `path`: into a temporary file beside it, then renamed over
    it (a reader sees the old report or the new one whole, never a part; a task requeued
    replaces its previous attempt's). Its folder is made where missing. Return whether it
    was written; where not, a `TilestoreWarning` names `path` and the cause."""
    path = Path(path)
    partial = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # a name of its own (two attempts of a task may overlap), made as any file (umask)
        partial = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.partial")
        with open(partial, "x") as file:
            json.dump(data, file, indent=2, default=str)
        os.replace(partial, path)
        partial = None
        return True
    except OSError as exc:
        cause = exc.strerror or str(exc)
        warnings.warn(
            f"{path}: the run's report was not written ({cause}); the run's outcome stands "
            "as its exit status says",
            TilestoreWarning,
            stacklevel=2,
        )
        return False
    finally:
        if partial is not None:
            with contextlib.suppress(OSError):
                os.unlink(partial)


def ended(data: dict[str, Any], code: int, *, refused: bool = False) -> dict[str, Any]:
    """The report with how its run ended: `outcome` (`tilestore.embed.outcome`'s word:
    complete, partial, nothing done, interrupted; refused: damaged input, the command
    refused before any work) and `exit_code`."""
    word = "damaged input" if refused and code == BAD_INPUT else outcome(code)
    return {**data, "outcome": word, "exit_code": code}


def brief_report(
    model: str,
    *,
    skipped: Iterable[tuple[str, str]] = (),
    failed: Iterable[tuple[str, str]] = (),
    share: dict[str, Any] | None = None,
    note: str | None = None,
) -> dict[str, Any]:
    """The report of a run that embedded nothing (an empty share, every store complete
    already or refused, a run refused or interrupted before its model loaded), with the
    keys a run's report has: slides, skipped, failures, finished, kept, tiles."""
    skipped = [{"store": str(store), "why": why} for store, why in skipped]
    return {
        "model": {"name": model},
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "tiles": 0,
        "total": 0,
        "slides": [],
        "skipped": skipped,
        "failures": [{"store": str(store), "error": why} for store, why in failed],
        "finished": [],
        "kept": {},
        **({"share": share} if share is not None else {}),
        **({"notes": [note]} if note else {}),
    }


def kept_said(data: dict[str, Any], given: int) -> str:
    """What an interrupted run kept, in words for its last line: the stores finished (now
    or before) of the `given`, named, and the tiles kept of each store left unfinished."""
    finished = sorted(Path(s).name for s in data.get("finished", []))
    finished = sorted(finished + [Path(s["store"]).name for s in data.get("skipped", [])])
    named = ", ".join(finished[:NAMED]) + (", ..." if len(finished) > NAMED else "")
    said = f"{len(finished)} of {given} store(s) finished" + (f" ({named})" if named else "")
    kept = [(Path(store).name, tiles) for store, tiles in data.get("kept", {}).items() if tiles]
    if kept:
        said += "; " + ", ".join(f"{tiles:,} tiles of {name}" for name, tiles in kept) + " kept"
    return said
