"""The model on its device as the GPU loop runs it: a batch of uint8 tiles in, features out.

`Forward` applies the model's transform and the model under inference mode and, in bf16,
autocast. Compiled, the transform is fused with the model's first layers (uint8 in, no
float32 copy of the batch in between) and on a GPU each batch is one CUDA graph replay
(`tilestore.embed.graphs`). Batch sizes are chosen in `tilestore.embed.sizing`.
"""

from __future__ import annotations

import contextlib

import torch

from tilestore.embed.graphs import GraphedForward
from tilestore.embed.models import LoadedModel
from tilestore.embed.settings import Precision


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
