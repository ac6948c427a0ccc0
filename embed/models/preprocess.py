"""The transform a model expects, applied to batches of uint8 tiles on whatever device they are.

Tiles arrive as (n, h, w, 3) uint8 footprints read from the store. Following timm's data
config (resolve_data_config: input size, interpolation, crop_pct, mean, std), they are
resized so the crop is input_size (antialiased, as torchvision's Resize), centre-cropped
and normalised, in one pass on the GPU. The engine and the reference loop use this same
function, so their only differences are decoding, batching and precision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Transform:
    """Resize (antialiased) to `resize`, centre-crop to `input_size`, normalise."""

    input_size: int
    resize: int
    interpolation: str  # "bilinear" or "bicubic"
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    # mean and std (x 255) as tensors, per device, made once: torch.tensor(..., device="cuda")
    # is a blocking copy, and made per batch it would stall the GPU loop at every batch
    _constants: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Transform:
        """Build from a timm data config (input_size, interpolation, crop_pct, mean, std)."""
        size = int(config["input_size"][-1])
        crop_pct = float(config.get("crop_pct") or 1.0)
        interpolation = config.get("interpolation") or "bilinear"
        if interpolation not in ("bilinear", "bicubic"):
            interpolation = "bilinear"
        return cls(
            size,
            math.floor(size / crop_pct),
            interpolation,
            tuple(float(v) for v in config["mean"]),
            tuple(float(v) for v in config["std"]),
        )

    def describe(self) -> dict[str, Any]:
        return {
            "input_size": self.input_size,
            "resize": self.resize,
            "interpolation": self.interpolation,
            "antialias": True,
            "center_crop": self.input_size,
            "mean": list(self.mean),
            "std": list(self.std),
        }

    def __call__(self, tiles: torch.Tensor) -> torch.Tensor:
        """(n, h, w, 3) uint8 -> (n, 3, size, size) float32, channels_last."""
        x = tiles.permute(0, 3, 1, 2).float()
        if x.shape[-2:] != (self.resize, self.resize):
            x = F.interpolate(
                x,
                size=(self.resize, self.resize),
                mode=self.interpolation,
                antialias=True,
                align_corners=False,
            )
            if self.interpolation == "bicubic":
                x = x.clamp_(0, 255)  # bicubic overshoots; uint8 images cannot
        if self.resize != self.input_size:
            top = (self.resize - self.input_size) // 2
            x = x[..., top : top + self.input_size, top : top + self.input_size]
        mean, std = self._mean_std(x.device)
        return ((x - mean) / std).contiguous(memory_format=torch.channels_last)

    def prepare(self, device: str | torch.device) -> None:
        """Make the constants on `device` now. Made inside a compiled call, they would
        be that graph's output, and the next call, finding them, would be compiled again
        (torch.compile guards on what the transform holds)."""
        self._mean_std(torch.empty(0, device=device).device)  # "cuda" -> "cuda:0", its key

    def _mean_std(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        key = str(device)
        if key not in self._constants:
            self._constants[key] = tuple(
                (torch.tensor(values).view(1, 3, 1, 1) * 255).to(device)
                for values in (self.mean, self.std)
            )
        return self._constants[key]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_constants": {}}  # device tensors stay in their process
