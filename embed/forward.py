"""The model on its device as the GPU loop runs it: a batch of uint8 tiles in, features out.

`Forward` applies the model's transform and the model under inference mode and, in bf16,
autocast. Compiled, the transform is fused with the model's first layers (uint8 in, no
float32 copy of the batch in between) and on a GPU each batch is one CUDA graph replay
(`embed.graphs`). `best_batch` measures the largest batch that still speeds the model up.
"""

from __future__ import annotations

import contextlib
import time

import torch

from embed.graphs import GraphedForward
from embed.models import LoadedModel
from embed.settings import Precision

BATCHES = (32, 64, 128, 256, 512, 1024)  # tried in turn by `best_batch`
GAIN = 1.05  # a doubled batch is kept only if it runs at least 5% more tiles/s


def place(loaded: LoadedModel, device: torch.device) -> LoadedModel:
    """Move the model to `device` for inference (channels-last on CUDA); return it."""
    loaded.module.to(device).eval()
    if device.type == "cuda":
        loaded.module.to(memory_format=torch.channels_last)
    return loaded


class Forward:
    """Features of batches of (n, h, w, c) uint8 tiles on the model's device."""

    def __init__(
        self, loaded: LoadedModel, device: torch.device, precision: Precision, compile: bool
    ) -> None:
        self.loaded, self.device, self.precision = loaded, device, precision
        self.compiled = None
        if compile:
            loaded.transform.prepare(device)  # not inside the first compiled call
            compiled = torch.compile(self._eager)
            self.compiled = GraphedForward(compiled) if device.type == "cuda" else compiled

    def _eager(self, tiles: torch.Tensor) -> torch.Tensor:
        return self.loaded.features(self.loaded.transform(tiles))

    def __call__(self, tiles: torch.Tensor, count: int, eager: bool = False) -> torch.Tensor:
        """Features of the first `count` tiles of a batch buffer (on the device).

        Compiled, the whole buffer goes through (one graph for every batch, the last one
        padded); `eager` runs the model as it is, uncompiled.
        """
        compiled = self.compiled is not None and not eager
        if not compiled:
            tiles = tiles[:count]
        forward = self.compiled if compiled else self._eager
        autocast = (
            torch.autocast(self.device.type, dtype=torch.bfloat16)
            if self.precision == "bf16"
            else contextlib.nullcontext()
        )
        with torch.inference_mode(), autocast:
            return forward(tiles)[:count]


def best_batch(loaded: LoadedModel, device: torch.device, precision: Precision) -> int:
    """The largest of `BATCHES` that fits on the GPU, stopping where doubling gains under
    5%. Measured on the eager model even for compile=True: compiling at every size tried
    would cost a compilation each and leave a dynamic-shape graph behind."""
    forward = Forward(loaded, device, precision, compile=False)
    size = loaded.transform.resize
    best, best_rate = BATCHES[0], 0.0
    for batch in BATCHES:
        tiles = None
        try:
            tiles = torch.randint(0, 255, (batch, size, size, 3), dtype=torch.uint8, device=device)
            forward(tiles, batch)
            torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            for _ in range(3):
                forward(tiles, batch)
            torch.cuda.synchronize(device)
            rate = 3 * batch / (time.perf_counter() - t0)
        except torch.OutOfMemoryError:
            break
        finally:
            del tiles
            torch.cuda.empty_cache()
        if rate < best_rate * GAIN:
            break
        best, best_rate = batch, rate
    return best
