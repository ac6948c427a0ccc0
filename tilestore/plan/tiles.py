"""Reading a plan's tiles in order, each store chunk fetched and decoded exactly once.

`chunk_schedule` is pure: for each grid row of the plan it says which chunks to load
before its tiles can be cut and which chunks no later row needs. Because plan rows move
down the slide, a chunk dropped is never wanted again, and memory holds at most the chunk
rows one tile row spans. The CPU reader below and the GPU engine follow the same schedule;
the GPU engine joins a small slide's rows into one step (`joined`).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from tilestore.plan.grid import TilePlan, tile_chunk_keys
from tilestore.reading.slide import Slide


@dataclass(frozen=True)
class Step:
    """One grid row of a plan: the chunks to load first, the tiles, the chunks to drop after."""

    tiles: np.ndarray  # plan indices, in plan order
    load: np.ndarray  # (k, 2) chunk (row, col) not loaded yet
    drop: np.ndarray  # (m, 2) chunks no later step needs


def chunk_schedule(plan: TilePlan) -> list[Step]:
    """Return the steps that read every chunk the plan needs once, in plan order.

    A chunk loads at the first grid row that needs it and drops after the last row whose
    successor starts below it (rows move down, so no later row needs it). Array operations
    over every (tile, chunk) pair; the only loop is over grid rows.
    """
    if not len(plan):
        return []
    order = np.argsort(plan.row, kind="stable")
    new_row = np.r_[True, np.diff(plan.row[order]) != 0]
    starts = np.flatnonzero(new_row)
    step_of = np.cumsum(new_row) - 1  # of each tile in `order`
    rows = plan.chunk_rows[order]
    tile, keys = tile_chunk_keys(rows, plan.chunk_cols[order])  # tiles in row order
    keys, first = np.unique(keys, return_index=True)  # first occurrence: the earliest row
    load_at = step_of[tile[first]]
    top = np.minimum.reduceat(rows[:, 0], starts)  # first chunk row of each grid row
    drop_at = np.maximum(np.searchsorted(top[1:], keys >> 32, side="right"), load_at)
    loads, drops = _by_step(keys, load_at, len(starts)), _by_step(keys, drop_at, len(starts))
    return [
        Step(tiles, load, drop)  # a stable sort keeps each row's tiles in plan order
        for tiles, load, drop in zip(np.split(order, starts[1:]), loads, drops, strict=True)
    ]


def joined(steps: list[Step], plan: TilePlan, limit: int) -> list[Step]:
    """Consecutive steps joined while the chunks they span, stitched as one band, hold at
    most `limit` pixels: a small slide's grid rows are then read and cut at once, a wide
    slide's one by one as `chunk_schedule` gives them. Each chunk is still loaded once,
    before the step that needs it, and dropped once no later step needs it."""
    if len(steps) < 2:
        return steps
    ch, cw = plan.chunk_shape
    starts = np.cumsum([0] + [len(step.tiles) for step in steps[:-1]])
    tiles = np.concatenate([step.tiles for step in steps])
    rows, cols = plan.chunk_rows[tiles], plan.chunk_cols[tiles]
    bounds = np.stack(
        [
            np.minimum.reduceat(rows[:, 0], starts),
            np.maximum.reduceat(rows[:, 1], starts),
            np.minimum.reduceat(cols[:, 0], starts),
            np.maximum.reduceat(cols[:, 1], starts),
        ],
        axis=1,
    ).tolist()
    groups: list[list[int]] = []
    span = None  # the chunk rows and columns of the group being joined
    for index, (r0, r1, c0, c1) in enumerate(bounds):
        if span is not None:
            wider = (min(span[0], r0), max(span[1], r1), min(span[2], c0), max(span[3], c1))
            if (wider[1] - wider[0] + 1) * (wider[3] - wider[2] + 1) * ch * cw <= limit:
                groups[-1].append(index)
                span = wider
                continue
        groups.append([index])
        span = (r0, r1, c0, c1)
    return [
        Step(
            np.concatenate([steps[i].tiles for i in group]),
            np.concatenate([steps[i].load for i in group]),
            np.concatenate([steps[i].drop for i in group]),
        )
        if len(group) > 1
        else steps[group[0]]
        for group in groups
    ]


def _by_step(keys: np.ndarray, step: np.ndarray, count: int) -> list[np.ndarray]:
    """(row, col) pairs of sorted keys, split by step (0..count-1), each part still sorted."""
    order = np.argsort(step, kind="stable")
    bounds = np.searchsorted(step[order], np.arange(1, count))
    return np.split(_pairs(keys[order]), bounds)


def _pairs(keys: np.ndarray) -> np.ndarray:
    return np.stack([keys >> 32, keys & 0xFFFFFFFF], axis=1)


def cut_tile(
    cache: dict[tuple[int, int], np.ndarray],
    y0: int,
    x0: int,
    read: int,
    chunk: tuple[int, int],
    out: np.ndarray,
) -> None:
    """Copy the (read, read) window at level pixel (y0, x0) from its (<= 4) chunks into out."""
    ch, cw = chunk
    for r in range(y0 // ch, (y0 + read - 1) // ch + 1):
        ty0, ty1 = max(y0, r * ch), min(y0 + read, (r + 1) * ch)
        for c in range(x0 // cw, (x0 + read - 1) // cw + 1):
            tx0, tx1 = max(x0, c * cw), min(x0 + read, (c + 1) * cw)
            out[ty0 - y0 : ty1 - y0, tx0 - x0 : tx1 - x0] = cache[(r, c)][
                ty0 - r * ch : ty1 - r * ch, tx0 - c * cw : tx1 - c * cw
            ]


def iter_tiles(slide: Slide, plan: TilePlan, workers: int = 4) -> Iterator[tuple[int, np.ndarray]]:
    """Yield (plan index, (read, read, c) footprint pixels) in plan order, decoding on threads."""
    reader = slide.chunks(plan.spec.level)
    chunk = (reader.chunk_h, reader.chunk_w)
    read = plan.spec.read
    ly, lx = plan.level_y, plan.level_x
    cache: dict[tuple[int, int], np.ndarray] = {}
    with ThreadPoolExecutor(workers) as pool:
        for step in chunk_schedule(plan):
            coords = [tuple(rc) for rc in step.load.tolist()]
            cache.update(zip(coords, reader.load(coords, pool), strict=True))
            for index in step.tiles:
                out = np.empty((read, read, reader.channels), reader.array.dtype)
                cut_tile(cache, int(ly[index]), int(lx[index]), read, chunk, out)
                yield int(index), out
            for rc in step.drop.tolist():
                del cache[tuple(rc)]
