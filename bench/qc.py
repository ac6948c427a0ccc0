"""QC: accuracy on artefacts painted on real H&E, speed on a 100k px slide, a Dask cohort.

    python bench/qc.py accuracy              # the confusion table (docs/guide/qc.md)
    python bench/qc.py blur                  # blur 0.75-4 um at 0.25 and 0.5 um/px: maps, tiles
    python bench/qc.py speed --size 100000   # a 100k x 100k px slide, CPU (and CUDA if any)
    python bench/qc.py cohort --slides 50    # 50 stores, one process vs a local Dask cluster

Each arm prints a table and writes bench/results/qc-<arm>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tifffile
from scipy import ndimage

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import tilestore  # noqa: E402
from tests.tilestore import artefacts as A  # noqa: E402
from tilestore.qc import QCOptions, compute_qc, qc_cohort  # noqa: E402

DATA = Path(os.environ.get("TILESTORE_DATA", HERE.parents[1] / "shared" / "data"))
CMU = DATA / "slides" / "CMU-1-Small-Region.svs"
MARGIN_UM = 40


def _store(work: Path, name: str, image: np.ndarray, mpp: float = A.MPP) -> Path:
    tif = work / f"{name}.tif"
    tifffile.imwrite(tif, image, tile=(256, 256), compression="zlib")
    store = work / f"{name}.ome.zarr"
    tilestore.convert(tif, store, mpp=mpp)
    return store


def accuracy(work: Path, mpp: float) -> dict:
    image = tifffile.imread(CMU)
    clean = A.Case("clean", "", image, np.zeros(image.shape[:2], bool))
    rows = []
    for case in [clean, *A.cases(image)]:
        store = _store(work, case.name.replace(" ", "_"), case.image)
        maps = compute_qc(tilestore.open_slide(store), QCOptions(mpp=mpp, device="cpu"))
        truth = A.on_grid(case.truth, maps.downsample, maps.bits.shape)
        near = ndimage.binary_dilation(truth, iterations=round(MARGIN_UM / maps.mpp))
        clean_tissue = maps.tissue & ~(near if truth.any() else truth)
        seen = truth if case.detector in ("pen", "bubble") else truth & maps.tissue
        row = {
            "case": case.name,
            "detector": case.detector or "-",
            "clean_flagged": float((maps.bits > 0)[clean_tissue].mean()),
            # share of the painted region each detector marked (the confusion row)
            "marked": {
                n: float(maps.mask(n)[seen].mean()) if seen.any() else 0.0 for n in maps.classes
            },
        }
        if case.detector:
            found = maps.mask(case.detector)
            row["iou"] = float((found & seen).sum() / max((found | seen).sum(), 1))
        rows.append(row)
    names = list(rows[0]["marked"])
    print(f"QC accuracy at {mpp} um/px: CMU-1-Small-Region with painted artefacts")
    print("| painted | IoU | clean tissue flagged | " + " | ".join(names) + " |")
    print("|---" * (3 + len(names)) + "|")
    for r in rows:
        iou = f"{r['iou']:.2f}" if "iou" in r else "-"
        marks = " | ".join(f"{r['marked'][n]:.2f}" for n in names)
        print(f"| {r['case']} | {iou} | {r['clean_flagged']:.1%} | {marks} |")
    return {"mpp": mpp, "rows": rows}


SIGMAS_UM = (0.75, 1.0, 1.5, 2.0, 4.0)
TCGA = DATA / "annotations" / "TCGA-A7-A13E-01Z-00-DX1.tif"  # a real 40x crop, 0.2456 um/px


def _blur(image: np.ndarray, truth: np.ndarray, sigma_px: float) -> np.ndarray:
    soft = ndimage.gaussian_filter(image.astype(np.float32), (sigma_px, sigma_px, 0))
    return np.where(truth[..., None], np.clip(soft + 0.5, 0, 255), image).astype(np.uint8)


def _sources() -> dict[float, tuple[np.ndarray, np.ndarray]]:
    """The painted slides' tissue at each scan resolution, and where blur is painted: CMU-1
    as scanned (0.499 um/px) and enlarged twice (bicubic) as a 0.25 um/px scan, its 400 um
    square over epidermis and dermis."""
    from PIL import Image

    image = tifffile.imread(CMU)
    truth = np.zeros(image.shape[:2], bool)
    truth[1500:2300, 850:1650] = True
    big = np.asarray(Image.fromarray(image).resize((image.shape[1] * 2, image.shape[0] * 2),
                                                   Image.Resampling.BICUBIC))  # fmt: skip
    return {A.MPP: (image, truth), A.MPP / 2: (big, np.kron(truth, np.ones((2, 2), bool)))}


def _tiles_of(store: Path):
    """The 224 px tiles an embedding at 0.5 um/px reads, their level-0 corners and the
    per-tile measures the embedding pass would store for them."""
    import torch

    from tilestore.embed.forward import QualityLayout
    from tilestore.plan import PlanOptions, plan_over_tissue
    from tilestore.plan.tiles import iter_tiles

    slide = tilestore.open_slide(store)
    plan = plan_over_tissue(slide, PlanOptions(mpp=0.5, tile=224))
    tiles = np.stack([t for _, t in iter_tiles(slide, plan)])
    layout = QualityLayout(0.5, 224)
    blur = np.concatenate([layout.measure(torch.from_numpy(tiles[i : i + 64])).numpy()[:, 0]
                           for i in range(0, len(tiles), 64)])  # fmt: skip
    return plan, blur


def blur_sweep(work: Path) -> dict:
    """Blur of sigma 0.75-4 um painted on real H&E scanned at 0.5 and 0.25 um/px: the QC
    maps (IoU with the painted tissue, clean tissue flagged) and the per-tile columns of an
    embedding at 0.5 um/px (tiles at least half inside the painted tissue found, clean
    tiles flagged); and clean tissue of a real 40x crop (TCGA) as another sample."""
    from tilestore.qc import QCOptions, compute_qc
    from tilestore.qc.tilewise import TileLimits

    limit = TileLimits().max_blur
    rows = []
    for slide_mpp, (image, truth) in _sources().items():
        for sigma in (0.0, *SIGMAS_UM):
            painted = _blur(image, truth, sigma / slide_mpp) if sigma else image
            store = _store(work, f"blur-{slide_mpp:g}-{sigma:g}", painted, mpp=slide_mpp)
            judged = {}
            for mode in ("full", "sparse"):
                maps = compute_qc(
                    tilestore.open_slide(store), QCOptions(device="cpu", fine_blur=mode)
                )
                seen = A.on_grid(truth, maps.downsample, maps.bits.shape) & maps.tissue
                near = ndimage.binary_dilation(seen, iterations=round(MARGIN_UM / maps.mpp))
                clean = maps.tissue & ~near
                found = maps.mask("blur")
                judged[mode] = (
                    float((found & seen).sum() / max((found | seen).sum(), 1)) if sigma else None,
                    float(found[clean].mean()),
                )
            plan, blur = _tiles_of(store)
            fh, fw = plan.footprint0()
            inside = np.array([truth[y : y + int(fh), x : x + int(fw)].mean() for x, y in
                               zip(plan.x, plan.y, strict=True)])  # fmt: skip
            flagged = np.nan_to_num(blur, nan=-np.inf) > limit
            positive, negative = inside >= 0.5, inside == 0
            row = {
                "slide_mpp": slide_mpp,
                "sigma_um": sigma,
                "maps_iou": judged["full"][0],
                "maps_clean_flagged": judged["full"][1],
                "sparse_iou": judged["sparse"][0],
                "sparse_clean_flagged": judged["sparse"][1],
                "tiles_found": float(flagged[positive].mean()) if sigma else None,
                "tiles_clean_flagged": float(flagged[negative].mean()),
                "tiles": len(plan),
            }
            rows.append(row)
            print(row, flush=True)
    tcga = tifffile.imread(TCGA)
    store = _store(work, "tcga-clean", tcga, mpp=0.2456)
    maps = compute_qc(tilestore.open_slide(store), QCOptions(device="cpu", fine_blur="full"))
    sparse = compute_qc(tilestore.open_slide(store), QCOptions(device="cpu", fine_blur="sparse"))
    _, blur = _tiles_of(store)
    rows.append({"slide_mpp": 0.2456, "sigma_um": 0.0, "source": "TCGA-A7-A13E crop",
                 "maps_clean_flagged": float(maps.mask("blur")[maps.tissue].mean()),
                 "sparse_clean_flagged": float(sparse.mask("blur")[sparse.tissue].mean()),
                 "tiles_clean_flagged": float((np.nan_to_num(blur, nan=-np.inf) > limit).mean()),
                 "tiles": len(blur)})  # fmt: skip
    print(f"\nBlur painted on real H&E; maps at 4 um/px with the fine pass at 0.5 um/px; "
          f"per-tile blur of 224 px tiles at 0.5 um/px, limit {limit}")  # fmt: skip
    print("| scan um/px | blur sigma um | maps IoU (full / sparse) | maps: clean tissue flagged "
          "(full / sparse) | tiles found | tiles: clean flagged | tiles |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        pct = lambda v: "-" if v is None else f"{v:.1%}"  # noqa: E731
        iou = "-" if r.get("maps_iou") is None else f"{r['maps_iou']:.2f} / {r['sparse_iou']:.2f}"
        name = r.get("source", "CMU-1" if abs(r["slide_mpp"] - A.MPP) < 0.01 else "CMU-1 x2")
        print(f"| {r['slide_mpp']:.3g} ({name}) | {r['sigma_um']:g} | {iou} | "
              f"{pct(r['maps_clean_flagged'])} / {pct(r['sparse_clean_flagged'])} | "
              f"{pct(r.get('tiles_found'))} | "
              f"{pct(r['tiles_clean_flagged'])} | {r['tiles']} |")  # fmt: skip
    return {"limit": limit, "rows": rows}


def speed(size: int, slide_mpp: float, devices: list[str], reps: int, fine: str = "auto") -> dict:
    """QC wall of one store: as `tilestore qc` meets a fresh store (tissue mask computed
    too) and with the mask already there (`tilestore tissue` ran first); first call of the
    process and the median of `reps`; and the chunks decoded in the last run (what the
    fine blur pass's reading costs), with the fine pass as `fine` says."""
    from make_slide import make_large_svs

    from tilestore.masks.tissue import compute_tissue

    svs = make_large_svs(HERE / "data" / f"large-{size}-{slide_mpp}.svs", size, slide_mpp)
    store = HERE / "data" / "stores" / f"large-{size}-{slide_mpp}.ome.zarr"
    if not store.exists():
        t = time.perf_counter()
        tilestore.convert(svs, store)
        print(f"converted {svs.name} in {time.perf_counter() - t:.1f} s")
    slide = tilestore.open_slide(store)
    mask = compute_tissue(slide)
    rows = []
    decodes = _count_decodes()
    print(
        "| slide | device | fine blur | map | tissue mask | first s | median s | Mpx/s | decodes |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for device in devices:
        for with_mask in (False, True):
            walls = []
            for _ in range(reps):
                decodes[0] = 0
                t = time.perf_counter()
                given = mask if with_mask else None
                maps = compute_qc(slide, QCOptions(device=device, fine_blur=fine), tissue=given)
                walls.append(time.perf_counter() - t)
            mpx = maps.bits.size / 1e6
            median = float(np.median(walls))
            rows.append(
                {"device": device, "tissue_stored": with_mask, "seconds": walls, "fine_blur": fine,
                 "median": median, "mpx": mpx, "decodes": decodes[0], "notes": maps.notes}
            )  # fmt: skip
            print(
                f"| {size:,} px at {slide_mpp} um/px | {device} | {fine} | {maps.mpp:.2f} um/px, "
                f"{maps.bits.shape[1]}x{maps.bits.shape[0]} | "
                f"{'stored' if with_mask else 'computed'} | {walls[0]:.1f} | {median:.1f} | "
                f"{mpx / median:.1f} | {decodes[0]:,} |"
            )
    return {"size": size, "slide_mpp": slide_mpp, "cpus": os.cpu_count(), "rows": rows}


def _count_decodes() -> list[int]:
    """A counter of the JPEG chunks decoded in this process from now on (element 0)."""
    from tilestore.format.chunks import ChunkReader

    count, decode = [0], ChunkReader.decode_into

    def counted(self, *args, **kwargs):
        count[0] += 1
        return decode(self, *args, **kwargs)

    ChunkReader.decode_into = counted
    return count


def cohort(work: Path, slides: int, workers: int) -> dict:
    from tilestore.embed.cohort import cpu_share, local_cluster

    image = tifffile.imread(CMU)
    source = _store(work, "cohort-source", image)
    stores = []
    for i in range(slides):
        stores.append(work / f"c{i:03d}.ome.zarr")
        shutil.copytree(source, stores[-1])
    serial, serial_wall = qc_cohort(stores, QCOptions(device="cpu"))
    client = local_cluster("local", workers)
    try:
        parallel, dask_wall = qc_cohort(
            stores, QCOptions(device="cpu"), client=client, threads=cpu_share(workers)
        )
    finally:
        client.cluster.close()
        client.close()
    ok = sum(r.error is None for r in parallel)
    print(f"| {slides} stores | one process | {serial_wall:.1f} s |")
    print(f"| {slides} stores | local Dask, {workers} workers | {dask_wall:.1f} s | {ok} ok |")
    return {
        "slides": slides,
        "workers": workers,
        "serial_s": serial_wall,
        "dask_s": dask_wall,
        "ok": ok,
        "errors": [r.error for r in serial + parallel if r.error],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("arm", choices=["accuracy", "blur", "speed", "cohort"])
    parser.add_argument("--mpp", type=float, default=4.0, help="accuracy: QC map um/px")
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--slide-mpp", type=float, default=0.25)
    parser.add_argument("--devices", default="cpu,cuda")
    parser.add_argument("--reps", type=int, default=3, help="speed: runs per row")
    parser.add_argument("--fine-blur", default="auto", help="speed: the fine blur pass's mode")
    parser.add_argument("--slides", type=int, default=50)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=HERE / "results") as tmp:
        work = Path(tmp)
        if args.arm == "accuracy":
            result = accuracy(work, args.mpp)
        elif args.arm == "blur":
            result = blur_sweep(work)
        elif args.arm == "speed":
            import torch

            devices = [
                d for d in args.devices.split(",") if d == "cpu" or torch.cuda.is_available()
            ]
            result = speed(args.size, args.slide_mpp, devices, args.reps, args.fine_blur)
        else:
            result = cohort(work, args.slides, args.workers)
    out = HERE / "results" / f"qc-{args.arm}.json"
    out.write_text(json.dumps(result, indent=2))
    print(f"-> {out}")


if __name__ == "__main__":
    (HERE / "results").mkdir(exist_ok=True)
    main()
