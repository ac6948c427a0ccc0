"""The compile cache filled ahead of a SLURM array (`tilestore models compile`).

The model is compiled once, through a run's own warm-up (`Embedder.warm_up`: the same
settings, batch size and cache key), for tiles of the size the array's runs will read: the
model's own tile, or the plan of a store given as a sample. The array's tasks then load
the entry instead of each compiling it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from tilestore.embed.engine import Embedder
from tilestore.embed.models import LoadedModel
from tilestore.embed.opening import PlanChoice, prepare
from tilestore.embed.settings import Options
from tilestore.errors import OptionError


@dataclass(frozen=True)
class Compiled:
    """What `compile_ahead` did."""

    model: str
    entry: Path  # the compile cache entry
    batch: int
    read: int  # the tiles' side as read, in px
    device: str
    compiled: bool  # False: the entry was there, or another process made it meanwhile
    seconds: float  # the whole command's, the model's load included
    notes: tuple[str, ...]  # the compile cache's


def compile_ahead(
    model: str | LoadedModel,
    options: Options = Options(),
    *,
    like: str | os.PathLike | None = None,
    plan: PlanChoice = None,
    say: Callable[[str], None] | None = None,
) -> Compiled:
    """Compile `model` into the compile cache (options.compile_cache) for the runs that
    `embed(..., options=options)` would make, unless its entry is there already.

    like: a store whose plan gives the tiles' read size (a slide scanned finer than the
    model's um/px, without a level at it, is read in larger windows: another shape, another
    entry); None: the model's own tile size. plan: which plan of `like`, as `embed` takes
    it. say: told each step as it happens (compiling, waiting for another process)."""
    if options.compile_cache in (None, "off"):
        raise OptionError(
            "compile_cache='off': there is no cache to fill; name a folder (or 'auto')"
        )
    started = time.perf_counter()
    with Embedder(model, replace(options, compile=True)) as embedder:
        read = _read(embedder, like, plan)
        runner = embedder.runner
        cache = runner.compile_cache(embedder.settings.batch_size, read)
        notes = [cache.load()]
        if not cache.loaded:
            notes = embedder.warm_up(read, say)
        return Compiled(
            model=embedder.loaded.spec.name,
            entry=cache.path,
            batch=embedder.settings.batch_size,
            read=read,
            device=str(embedder.settings.device),
            compiled=runner.compiled_s is not None,
            seconds=time.perf_counter() - started,
            notes=tuple(notes),
        )


def _read(embedder: Embedder, like: str | os.PathLike | None, plan: PlanChoice) -> int:
    """The tiles' side as the runs read them: from the sample store's plan, else the
    model's tile."""
    if like is None:
        return embedder.loaded.spec.tile
    identity = embedder.writer_identity()
    sample = prepare(
        like,
        embedder.loaded.spec,
        plan,
        identity,
        save=False,
        any_scale=embedder.settings.any_scale,
    )
    return sample.plan.spec.read
