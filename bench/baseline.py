"""The pipeline most tools use, as the baseline: OpenSlide read_region per tile in a DataLoader.

torch DataLoader with 8 worker processes, each opening the SOURCE slide with OpenSlide and
reading one tile per item (read_region -> PIL -> RGB), CPU torchvision transforms (ToTensor,
Normalize), batch 64, pinned memory, the model in fp16 on the GPU.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms


class OpenSlideTiles(Dataset):
    """Tiles at level-0 positions of a slide file, read one by one with OpenSlide."""

    def __init__(self, path: str, xs: np.ndarray, ys: np.ndarray, size: int, mean, std) -> None:
        self.path, self.xs, self.ys, self.size = path, xs, ys, size
        self.transform = transforms.Compose(
            [transforms.ToTensor(), transforms.Normalize(mean, std)]
        )
        self.slide = None

    def __len__(self) -> int:
        return len(self.xs)

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.slide is None:  # one handle per worker process
            import openslide

            self.slide = openslide.OpenSlide(self.path)
        image = self.slide.read_region(
            (int(self.xs[index]), int(self.ys[index])), 0, (self.size, self.size)
        ).convert("RGB")
        return self.transform(image)


def run_baseline(
    path: str,
    xs: np.ndarray,
    ys: np.ndarray,
    module: torch.nn.Module,
    size: int = 224,
    mean=(0.485, 0.456, 0.406),
    std=(0.229, 0.224, 0.225),
    workers: int = 8,
    batch: int = 64,
    device: str = "cuda",
) -> dict:
    """Embed the tiles; return tiles/s over the whole loop (workers' start-up included)."""
    model = module.half().to(device).eval()
    loader = DataLoader(
        OpenSlideTiles(path, xs, ys, size, mean, std),
        batch_size=batch,
        num_workers=workers,
        pin_memory=True,
        prefetch_factor=4,
    )
    n = 0
    torch.cuda.synchronize()
    started = time.perf_counter()
    with torch.inference_mode():
        for x in loader:
            model(x.to(device, non_blocking=True).half())
            n += len(x)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    return {
        "tiles": n,
        "seconds": seconds,
        "tiles_per_s": n / seconds,
        "workers": workers,
        "batch": batch,
    }
