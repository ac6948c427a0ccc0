"""The slow, obviously right loop the engine is checked against: one tile at a time.

read_region -> the model's transform -> the model, no batching, no streams, no threads.
Tests and benchmarks compare the engine's stored features with this.
"""

from __future__ import annotations

import contextlib
from typing import Literal

import numpy as np
import torch

from tilestore.embed.models import LoadedModel
from tilestore.plan.grid import TilePlan
from tilestore.reading.slide import Slide


def reference_features(
    slide: Slide,
    plan: TilePlan,
    loaded: LoadedModel,
    *,
    indices=None,
    device: str = "cpu",
    precision: str = "fp32",
    tokens: int | Literal["model"] | None = None,
) -> np.ndarray:
    """Return (n, dim) float32 features of plan tiles (all, or `indices`); with `tokens`,
    each row followed by the tile's patch-token grid pooled to tokens x tokens ("model": the
    model's own grid), flattened, as the engine stores them."""
    indices = range(len(plan)) if indices is None else indices
    module = loaded.module.to(device).eval()
    autocast = (
        torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
        if precision == "bf16"
        else contextlib.nullcontext()
    )
    out = []
    for i in indices:
        tile = slide.read_region(
            int(plan.x[i]), int(plan.y[i]), plan.spec.read, plan.spec.read, level=plan.spec.level
        )
        x = torch.from_numpy(tile)[None].to(device)
        with torch.inference_mode(), autocast:
            x = loaded.transform(x)
            row = (
                loaded.features(x)
                if tokens is None
                else loaded.module.features_and_tokens(x, None if tokens == "model" else tokens)
            )
            out.append(row.float().cpu().numpy()[0])
    del module
    return np.stack(out)


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
