"""A slide's read-out on the GPU's path: the steps its tiles are read and cut by, and where
each step's new chunks lie for the decoder processes, made where its store is opened.

A store process (`tilestore.embed.storeside`) has the slide and its plan open; making the
steps there (`gpu_steps`: its grid rows, a small slide's joined) and locating their chunks
(its shard indexes) takes them off the run's process, whose GIL the GPU loop needs: for a
cohort of small slides they were a fifth of that GIL (bench/RESULTS.md, issue 68). The run
uses what comes (`tilestore.embed.produce`) and makes them itself where none does (the
stores opened on its own threads, a slide's nvJPEG fallback).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np

from tilestore.errors import ChunkError
from tilestore.format.integrity import Located
from tilestore.plan.grid import TilePlan
from tilestore.plan.tiles import Step, chunk_schedule, joined
from tilestore.reading import Slide

# a slide's chunks located where it is opened, at most (more: a large slide, located a row
# at a time as the run reads it, its locations never held all at once)
LOCATED_CHUNKS = 8192
# a step's band of chunks, at most (pixels): a small slide's grid rows are read and cut at
# once (`tilestore.plan.tiles.joined`); about one grid row of a 17,000 px slide
JOIN_PIXELS = 8_000_000


def gpu_steps(sub: TilePlan, join: int | None = None) -> list[Step]:
    """The steps a plan's tiles are read and cut by on the GPU: its grid rows, a small
    slide's joined while their chunks span at most `join` pixels (None: `JOIN_PIXELS`)."""
    return joined(chunk_schedule(sub), sub, JOIN_PIXELS if join is None else join)


@dataclass(frozen=True)
class Wanted:
    """What a run on a GPU asks of each slide's reading where its store is opened: the steps
    (`gpu_steps`, joined up to `join` pixels) and, with `located`, their chunks located
    (the run's decoder processes read them)."""

    located: bool
    join: int


@dataclass(frozen=True)
class ReadOut:
    """The steps of a job's tiles to do (`gpu_steps` of its plan's subset) and, where
    asked, its level's chunks are files or shard ranges and it has at most
    `LOCATED_CHUNKS`, each step's new chunks' locations (`Located`, in the order of
    `Step.load`)."""

    steps: list[Step]
    located: list[Located] | None = None


def read_out(
    pixels: Slide, plan: TilePlan, todo: np.ndarray, wanted: Wanted | None
) -> ReadOut | None:
    """The read-out of `todo` (global plan indices) as the run reads `pixels`; None where
    nothing is wanted or nothing is to do. A shard index found damaged leaves the chunks
    unlocated: the run finds the damage where it reads them, as for any slide."""
    if wanted is None or not len(todo):
        return None
    steps = gpu_steps(plan.subset(todo), wanted.join)
    if not wanted.located or sum(len(step.load) for step in steps) > LOCATED_CHUNKS:
        return ReadOut(steps)
    located = None
    with contextlib.suppress(ChunkError):
        reader = pixels.chunks(plan.spec.level)
        if reader.locations([]) is not None:
            located = [
                Located.of(reader.locations([tuple(rc) for rc in step.load.tolist()]))
                for step in steps
            ]
    return ReadOut(steps, located)
