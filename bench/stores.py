"""The benchmarks' stores: a large SVS of real tissue and the stores converted from it."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from make_slide import make_large_svs

import tilestore
from tilestore.plan import PlanOptions, list_plans, plan_over_tissue, save_plan


def build(
    work: Path, size: int, ycbcr_chunks: tuple[int, ...], checksums: bool = True
) -> tuple[Path, Path, list[Path]]:
    """The large SVS, its store (tiles copied: Aperio RGB-coded JPEG, its 240 px tiles as
    chunks) and YCbCr copies of it (re-encoded, in chunks of each of `ycbcr_chunks` px: what
    nvJPEG can decode), each with a 0.5 um/px, 224 px plan named 'bench'; checksums=False
    makes them without chunk checksums (in folders named so), to measure what they cost."""
    source = make_large_svs(work / f"large-{size}.svs", size)
    stores = []
    layouts = [("copied", True, None)]
    layouts += [("ycbcr" if c == 256 else f"ycbcr-{c}", False, c) for c in ycbcr_chunks]
    for name, copy_tiles, chunk in layouts:
        name = name if checksums else f"{name}-no-checksums"
        store = work / name / f"large-{size}.ome.zarr"
        if not store.exists():
            t0 = time.perf_counter()
            report = tilestore.convert(
                source, work / name, copy=copy_tiles, chunk=chunk, checksums=checksums
            )
            print(
                f"{name}: converted in {time.perf_counter() - t0:.1f} s "
                f"{[lv.write for lv in report.levels]}",
                flush=True,
            )
        slide = tilestore.open_slide(store)
        if "bench" not in list_plans(slide):
            save_plan(
                slide,
                plan_over_tissue(
                    slide, PlanOptions(mpp=0.5, tile=224, min_tissue=0.0, name="bench")
                ),
            )
        stores.append(store)
    return source, stores[0], stores[1:]


def copy_store(store: Path, to: Path) -> Path:
    """Another slide for the cohort run: a copy of the store (its embeddings are redone)."""
    if not to.exists():
        shutil.copytree(store, to)
    return to
