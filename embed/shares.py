"""A SLURM array's shares of a cohort (`--shard K/N`): which stores each task embeds.

Light on purpose: a task whose share is empty (an array larger than its cohort) finds so
and ends before anything imports torch or Dask (`tilestore embed --shard`)."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from tilestore.conversion import pixel_count
from tilestore.embed.settings import check_share


def shard(stores: Sequence[str | os.PathLike], k: int, n: int) -> list[str]:
    """Return the k-th (0-based) of n deterministic, size-balanced shares of a store list.

    Every job of a SLURM array computes the same split from the same list: stores sorted
    by size (largest first, then by name) go one by one to the share with the least work.
    """
    check_share(k, n)
    names = sorted({str(s) for s in stores})
    if k >= len(names):  # shares past the stores' count stay empty: nothing to size
        return []
    sizes = {s: _size(s) for s in names}
    load = np.zeros(min(n, len(names)))  # shares past the stores' count stay empty
    mine = []
    for store in sorted(names, key=lambda s: (-sizes[s], s)):
        target = int(np.argmin(load))
        load[target] += max(sizes[store], 1)
        if target == k:
            mine.append(store)
    return sorted(mine)


def _size(store: str) -> int:
    """Level-0 pixels of a store or slide file (a cheap proxy for its work), read without
    writing anything; 0 if it cannot be opened."""
    return pixel_count(store)
