"""Which readers open our stores without tilestore: each one tried, level 0 compared to ours.

Makes, with tilestore, a store of CMU-1-Small-Region as `convert` makes it (the slide's JPEG
tiles copied into shards, declared with imagecodecs' ``imagecodecs_jpeg`` codec) and one with
``codec="zstd"``, each with a finished and an unfinished embeddings group; then runs each
reader in `--python`, an interpreter WITHOUT tilestore (Python >= 3.12 with zarr, imagecodecs,
imagecodecs-zarr, xarray, ome-zarr, napari-ome-zarr, tensorstore; those absent are reported
so), and compares what it reads to what tilestore reads (level 0, every pixel; the features).

    python3.12 -m venv /tmp/readers && /tmp/readers/bin/pip install zarr imagecodecs \\
        imagecodecs-zarr xarray ome-zarr napari-ome-zarr tensorstore
    python bench/readers.py --python /tmp/readers/bin/python     # prints a table, writes JSON
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import zarr

HERE = Path(__file__).resolve().parent
SLIDE = HERE.parent.parent / "shared" / "data" / "slides" / "CMU-1-Small-Region.svs"

# each reader: code run in the other interpreter with `store`, `expected` (a .npy of level
# 0 as (y, x, c)) and `features` (a .npy) defined; it sets `level0` (y, x, c) or `got`
READERS = {
    "zarr-python + imagecodecs": """
import zarr
root = zarr.open_group(store, mode="r")
level0 = np.moveaxis(root["0"][:], 0, -1)
""",
    "xarray.open_zarr, finished embeddings": """
import xarray as xr
ds = xr.open_zarr(store, group="embeddings/fake/0.5mpp-224px", consolidated=False)
got = ds.features.values
""",
    "xarray.open_zarr, unfinished embeddings": """
import xarray as xr
ds = xr.open_zarr(store, group="embeddings/unfinished/0.5mpp-224px", consolidated=False)
got = ds.features.values[: len(features_unfinished)]
features = features_unfinished
""",
    "ome-zarr-py": """
from ome_zarr.io import parse_url
from ome_zarr.reader import Reader
node = list(Reader(parse_url(store))())[0]
level0 = np.moveaxis(np.asarray(node.data[0]), 0, -1)
""",
    "napari-ome-zarr (headless)": """
from napari_ome_zarr import napari_get_reader
# one image layer per channel (R, G, B), then the labels (tissue)
layers = [layer for layer in napari_get_reader(store)(store) if layer[2] == "image"]
level0 = np.stack([np.asarray(layer[0][0]) for layer in layers], axis=-1)
""",
    "tensorstore": """
import tensorstore as ts
array = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": store + "/0"}}).result()
level0 = np.moveaxis(array.read().result(), 0, -1)
""",
}

RUN = """
import json, sys, time
import numpy as np
import importlib.util
store, expected, features, unfinished = sys.argv[1:5]
expected, features = np.load(expected), np.load(features)
features_unfinished = np.load(unfinished)
out = {"tilestore_importable": importlib.util.find_spec("tilestore") is not None}
t0 = time.perf_counter()
try:
    got = level0 = None
    exec(sys.stdin.read())
    out["seconds"] = round(time.perf_counter() - t0, 3)
    if level0 is not None:
        level0 = level0[: expected.shape[0], : expected.shape[1]]
        out["equal"] = bool(np.array_equal(level0, expected))
        out["shape"] = list(level0.shape)
    else:
        out["equal"] = bool(np.array_equal(got, features, equal_nan=True))
        out["shape"] = list(got.shape)
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
print(json.dumps(out))
"""


def make_store(folder: Path, codec: str) -> tuple[Path, np.ndarray, np.ndarray, np.ndarray]:
    """A store of CMU with a finished and an unfinished embeddings group; return it, level
    0 as tilestore reads it, and both groups' features as tilestore reads them."""
    import tilestore
    from tilestore.embeddings import EmbeddingWriter, RunIdentity
    from tilestore.plan import PlanOptions, plan_over_tissue, save_plan

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        store = tilestore.convert(SLIDE, folder, codec=codec).store
    slide = tilestore.open_slide(store)
    plan = plan_over_tissue(slide, PlanOptions(mpp=0.5, tile=224))
    uid = save_plan(slide, plan)
    rng = np.random.default_rng(0)
    values = rng.standard_normal((len(plan), 16)).astype("float32")
    kept = {}
    for name, batches in (("fake", None), ("unfinished", 2)):
        identity = RunIdentity(
            {"name": name, "output_dim": 16},
            batch_size=32,
            dtype="float32",
            precision="fp32",
            compile=False,
            shard_tiles=64,
        )
        writer = EmbeddingWriter(slide, plan, uid, identity)
        for block in writer.todo()[:batches]:
            writer.write(int(block), values[block * 32 : (block + 1) * 32])
        writer.finish({}) if batches is None else writer.abandon()
        if batches is None:
            kept[name] = tilestore.open_embeddings(store, name).features.values
        else:  # tilestore refuses an unfinished group; its done batches, read as stored
            group = zarr.open_group(store / "embeddings" / name, mode="r")
            kept[name] = group["features"][: batches * 32]
    level0 = slide.read_region(0, 0, slide.shape[2], slide.shape[1], level=0)
    return store, level0, kept["fake"], kept["unfinished"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--python", required=True, help="an interpreter without tilestore")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "readers.json")
    args = parser.parse_args()
    found = subprocess.run(
        [args.python, "-c", "import importlib.util as u; print(u.find_spec('tilestore'))"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tempfile.gettempdir(),  # not this checkout, which `-c` would put on sys.path
    ).stdout.strip()
    if found != "None":
        sys.exit(f"{args.python}: tilestore is importable there ({found}); use one without it")
    version = subprocess.run(
        [args.python, "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for codec in ("jpeg", "zstd"):
            folder = Path(tmp) / codec
            store, level0, features, unfinished = make_store(folder, codec)
            np.save(folder / "level0.npy", level0)
            np.save(folder / "features.npy", features)
            np.save(folder / "unfinished.npy", unfinished)
            for reader, code in READERS.items():
                if reader == "tensorstore" and codec == "jpeg":
                    continue  # it has zarr v3's codecs only: zstd stores
                run = subprocess.run(
                    [
                        args.python,
                        "-c",
                        RUN,
                        str(store),
                        *(str(folder / f"{n}.npy") for n in ("level0", "features", "unfinished")),
                    ],
                    input=code,
                    capture_output=True,
                    text=True,
                    cwd=tmp,
                )
                lines = run.stdout.strip().splitlines()
                result = json.loads(lines[-1]) if lines else {"error": run.stderr[-300:]}
                rows.append({"store": codec, "reader": reader, **result})
            shutil.rmtree(folder)
    print(f"| store | reader (Python {version}, no tilestore) | reads | equal to tilestore | s |")
    print("|---|---|---|---|---|")
    for row in rows:
        ok = "error" not in row
        print(
            f"| {row['store']} | {row['reader']} | "
            f"{'yes ' + str(tuple(row['shape'])) if ok else 'no: ' + row['error']} | "
            f"{('yes' if row['equal'] else 'NO') if ok else '-'} | {row.get('seconds', '-')} |"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"machine": platform.node(), "python": version, "rows": rows}, indent=2)
    )


if __name__ == "__main__":
    main()
