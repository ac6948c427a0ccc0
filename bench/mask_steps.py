"""The tissue mask's steps, timed: where `compute_tissue` spends a large slide's seconds.

The slide is converted into a store (untimed), then the Otsu mask is computed twice, each
step of `tilestore.masks.tissue` and `tilestore.masks.holes` (and the resize and region read
they call) timed by a wrapper. Nested steps count in their parents too; the second run is the
warm one. Prints seconds per step, slowest first.

    python bench/mask_steps.py bench/data/large-100000.svs
"""

from __future__ import annotations

import argparse
import functools
import shutil
import threading
import time
from collections import defaultdict
from pathlib import Path

import tilestore.masks.holes as holes
import tilestore.masks.tissue as tissue
import tilestore.reading.slide as slide_module

TISSUE_STEPS = ("_low_resolution", "_polarity", "_saturation_split", "median_filter",
                "_otsu_threshold", "_clean", "_drop_small")  # fmt: skip
HOLES_STEPS = ("close_disk", "fill_holes", "holes", "hole_sizes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("slide", type=Path)
    parser.add_argument("--store", type=Path, default=Path("/tmp/mask_steps.ome.zarr"))
    args = parser.parse_args()
    spent: dict[str, float] = defaultdict(float)
    adding = threading.Lock()  # steps run on threads too (resize's channels)

    def timed(owner, name: str) -> None:
        function = getattr(owner, name)
        step = f"{owner.__name__.split('.')[-1]}.{name}"

        @functools.wraps(function)
        def wrapper(*a, **k):
            started = time.perf_counter()
            try:
                return function(*a, **k)
            finally:
                with adding:
                    spent[step] += time.perf_counter() - started

        setattr(owner, name, wrapper)

    for name in TISSUE_STEPS:
        timed(tissue, name)
    for name in HOLES_STEPS:
        timed(holes, name)
    timed(slide_module, "resize")
    timed(slide_module.Slide, "read_region")
    tissue.resize = slide_module.resize  # imported by name there

    from tilestore.conversion.converter import convert
    from tilestore.reading import open_slide

    shutil.rmtree(args.store, ignore_errors=True)
    convert(args.slide, args.store)
    opened = open_slide(args.store)
    for run in range(2):
        spent.clear()
        started = time.perf_counter()
        mask = tissue.compute_tissue(opened, "otsu")
        total = time.perf_counter() - started
        share = mask.mask.mean()
        print(f"run {run}: compute_tissue {total:.2f} s, {share:.3f} of the slide tissue")
        for step, seconds in sorted(spent.items(), key=lambda kv: -kv[1]):
            print(f"   {step:28} {seconds:.3f}")
    shutil.rmtree(args.store, ignore_errors=True)


if __name__ == "__main__":
    main()
