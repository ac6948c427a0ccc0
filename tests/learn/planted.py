"""The planted-region cohort: labels known by construction from real tile features.

Each synthetic "slide" is a bag of real tiles of one slide (the background: H&E tiles of
CMU-1-Small-Region); a positive slide has a region of its tiles replaced by tiles of another
real tissue and stain (the IHC image's tiles). A model that learned the task must find the
positives (held-out AUROC) and look at the planted tiles (their share of the top-k attention);
the same bags with shuffled labels must be at chance. Fed through the bags API from memory
(`tilestore.learn.bags.Bags.from_arrays`), not written as stores: the same features, without
a store per synthetic slide.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tilestore.learn.bags import Bags
from tilestore.learn.cohort import Cohort
from tilestore.learn.task import Task


@dataclass(frozen=True)
class Planted:
    cohort: Cohort
    bags: Bags
    slides: list[np.ndarray]  # each synthetic slide's features (tiles, D)
    planted: list[np.ndarray]  # each slide's planted tiles' indices (empty for negatives)


def planted_cohort(
    background: np.ndarray,
    region: np.ndarray,
    *,
    slides: int = 40,
    tiles: int = 48,
    planted: int = 6,
    seed: int = 0,
    shuffle: bool = False,
) -> Planted:
    """`slides` synthetic slides of `tiles` background tiles each (drawn from `background`),
    every other one with `planted` consecutive tiles replaced by tiles drawn from `region`;
    `shuffle`: the labels permuted (the control)."""
    rng = np.random.default_rng(seed)
    made, where, labels = [], [], []
    for i in range(slides):
        picked = background[rng.choice(len(background), tiles, replace=len(background) < tiles)]
        positive = i % 2 == 1
        spots = np.array([], dtype=np.int64)
        if positive:
            start = int(rng.integers(0, tiles - planted + 1))
            spots = np.arange(start, start + planted)
            picked = picked.copy()
            picked[spots] = region[rng.choice(len(region), planted, replace=True)]
        made.append(np.ascontiguousarray(picked, dtype=np.float32))
        where.append(spots)
        labels.append(int(positive))
    labels = np.array(labels)
    if shuffle:
        labels = rng.permutation(labels)
    patients = tuple(f"P{i:03d}" for i in range(slides))
    cohort = Cohort.from_labels(
        Task("classification", ("planted",), (("0", "1"),)), patients, labels[:, None]
    )
    bags = Bags.from_arrays(made, [[i] for i in range(slides)], names=patients)
    return Planted(cohort, bags, made, where)


def top_k_share(attention: list[np.ndarray], planted: list[np.ndarray]) -> float:
    """Of the positive slides' top-k attention tiles (k: the tiles planted), the share that
    are planted tiles."""
    hits = total = 0
    for a, spots in zip(attention, planted, strict=True):
        if len(spots) == 0:
            continue
        top = np.argsort(-a, kind="stable")[: len(spots)]
        hits += len(set(top.tolist()) & set(spots.tolist()))
        total += len(spots)
    return hits / total if total else float("nan")
