"""The on-device transform equals torchvision's Resize + CenterCrop + Normalize."""

from __future__ import annotations

import pytest
import torch
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as TF

from tilestore.embed.models.preprocess import Transform


@pytest.mark.parametrize(
    ("read", "interpolation", "crop_pct"),
    [
        (224, "bilinear", 1.0),
        (448, "bilinear", 1.0),
        (300, "bicubic", 1.0),
        (256, "bicubic", 224 / 256),
        (512, "bicubic", 224 / 256),
    ],
)
def test_matches_torchvision(read, interpolation, crop_pct):
    transform = Transform.from_config(
        {
            "input_size": (3, 224, 224),
            "interpolation": interpolation,
            "crop_pct": crop_pct,
            "mean": (0.485, 0.456, 0.406),
            "std": (0.229, 0.224, 0.225),
        }
    )
    tiles = torch.randint(0, 256, (3, read, read, 3), dtype=torch.uint8)
    got = transform(tiles)
    assert got.shape == (3, 3, 224, 224) and got.is_contiguous(memory_format=torch.channels_last)
    x = tiles.permute(0, 3, 1, 2).float()
    mode = InterpolationMode.BICUBIC if interpolation == "bicubic" else InterpolationMode.BILINEAR
    x = TF.resize(x, [transform.resize, transform.resize], interpolation=mode, antialias=True)
    if interpolation == "bicubic":
        x = x.clamp(0, 255)
    x = TF.center_crop(x, [224, 224])
    want = TF.normalize(x / 255, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_output_is_float32_channels_last_at_the_input_size():
    transform = Transform(224, 256, "bicubic", (0.5,) * 3, (0.5,) * 3)
    out = transform(torch.randint(0, 256, (2, 300, 300, 3), dtype=torch.uint8))
    assert out.shape == (2, 3, 224, 224) and out.dtype == torch.float32
    assert out.is_contiguous(memory_format=torch.channels_last)
