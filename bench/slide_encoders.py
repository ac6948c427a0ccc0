"""Our slide encoders against their reference implementations, and what they cost.

reference: for each registered slide encoder, the same stored tile features (seeded N(0, 1)
features of the encoder's tile model, written into the 40,000 px store on a plan at the
encoder's um/px and tile size: real grid coordinates, not a model's features) go out as
tilestore's TRIDENT-layout H5 (`tilestore export h5`). A separate process
(`bench/slide_references.py`, in an environment with the authors' requirements) builds the
authors' module from local copies of their code, draws random weights, saves them in the
layout the authors publish and computes the slide vector from the H5 through TRIDENT's
slide-feature task (`WSI.extract_slide_features`, TRIDENT's wrapper of each model); ours
loads the saved file through its own conversion and computes it from the store. fp32 (no
TF32), on --device for both sides.

speed: each encoder alone on a synthetic slide of N tiles (random features, a square grid):
seconds and peak memory (GPU: torch's peak allocation; CPU: the process's peak RSS above
what it held before), each in a fresh process.

The authors' code is read from --sources (default .slideref/sources: plain source trees,
REVISIONS their commits); what the wanted encoders need and it lacks is copied there first
from the git mirrors in --mirrors. `sources` does only that: made here, the folder travels to
a GPU machine as it is (bench/device_slides.sh).

    python bench/slide_encoders.py sources --encoders moozy,cobra,feather-uni
    python bench/slide_encoders.py reference --python /work/refvenv/bin/python \
        --trident .peers/TRIDENT
    python bench/slide_encoders.py speed --tiles 30000,100000 --device cpu
    # on a GPU (bench/RESULTS.md: the H100 run; bench/device_slides.sh: its set-up)
    python3 bench/slide_encoders.py reference --device cuda --trident .peers/TRIDENT
    python3 bench/slide_encoders.py speed --device cuda --tiles 30000,100000
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

# the authors' code the references build from: mirror folder name -> (its folder in
# --sources, the repository's folders with their code (mirrors may lack the large data files
# beside it), the encoders' archs that read it)
SOURCES = {
    "DIAGNijmegen+unicorn_baseline": ("unicorn_baseline", ["src"], ("titan", "prism")),
    "prov-gigapath+prov-gigapath": ("prov-gigapath", ["gigapath"], ("longnet",)),
    "mahmoodlab+MADELEINE": ("MADELEINE", ["madeleine"], ("madeleine",)),
    "mahmoodlab+MIL-Lab": ("MIL-Lab", ["src"], ("feather",)),  # FEATHER's ABMIL
    "hms-dbmi+CHIEF": ("CHIEF", ["models", "utils"], ("chief",)),
    "AtlasAnalyticsLab+MOOZY": ("MOOZY", ["moozy"], ("moozy",)),  # its slide and case modules
    "KatherLab+COBRA": ("COBRA", ["cobra"], ("cobra",)),
    "state-spaces+mamba": ("mamba", ["mamba_ssm"], ("cobra",)),  # COBRA's Mamba2
    "Dao-AILab+causal-conv1d": ("causal-conv1d", ["causal_conv1d"], ("cobra",)),  # its conv
}
ANY_TILE_MODEL = ("conch-v1.5", 0.5, 512)  # what the pooling encoders are checked on


def _features(n: int, dim: int, seed: str) -> np.ndarray:
    rng = np.random.default_rng(_seed(seed))
    return rng.standard_normal((n, dim), dtype=np.float32)


def _seed(text: str) -> int:
    return int.from_bytes(text.encode()[:8].ljust(8, b"\0"), "little") % 2**32


def tile_setup(spec) -> tuple[str, float, int, int]:
    """(tile model, um/px, tile px, feature width) an encoder is checked on: its own, or
    its tile model's where it reads any scale (COBRA)."""
    from tilestore.embed.models import get_model

    if not spec.tile_model:
        model, mpp, tile = ANY_TILE_MODEL
        return model, mpp, tile, get_model(model).output_dim
    facts = get_model(spec.tile_model)
    mpp, tile = spec.mpp or facts.native_mpp, spec.tile or facts.tile
    if spec.arch == "cobra":  # any scale: a quarter of the tiles, as the reference's
        tile *= 2  # sequential scan holds channels x tiles x state floats (10,801: > 23 GB)
    return spec.tile_model, mpp, tile, facts.output_dim


def store_features(store: Path, model: str, mpp: float, tile: int, dim: int) -> int:
    """Seeded features of `model` on a plan at mpp and tile (made once); their tile count."""
    import tilestore
    from tilestore.embeddings import list_embeddings
    from tilestore.embeddings.slides import read_tile_features
    from tilestore.embeddings.write import write_features
    from tilestore.plan import PlanOptions, list_plans, plan_over_tissue, save_plan

    name = f"slides-{mpp:g}mpp-{tile}px"
    slide = tilestore.open_slide(store)
    if name not in list_plans(slide):
        save_plan(slide, plan_over_tissue(slide, PlanOptions(mpp=mpp, tile=tile, name=name)))
    if model in list_embeddings(store):
        tiles = read_tile_features(store, model)
        if tiles.plan == name:
            return tiles.tiles
    from tilestore.plan import load_plan

    count = len(load_plan(slide, name)[0])
    info = {"name": model, "weights": "seeded N(0, 1) features (bench/slide_encoders.py)"}
    write_features(store, info, _features(count, dim, model), plan=name, overwrite=True)
    return count


def _wanted(args) -> list[str]:
    from tilestore.embed.slides import list_slide_encoders

    return args.encoders.split(",") if args.encoders else [s.name for s in list_slide_encoders()]


def fill_sources(args) -> Path:
    """--sources, the folder of the authors' code the references read (one plain source tree
    per SOURCES entry, and REVISIONS: each one's commit), with what the wanted encoders need
    and it lacks copied from --mirrors' git repositories (those there; a missing one's
    encoders' rows say what is missing). Made once here, it travels as it is (.slideref)."""
    from tilestore.embed.slides import get_slide_encoder

    archs = {get_slide_encoder(name).arch for name in _wanted(args)}
    for mirror, (name, folders, readers) in SOURCES.items():
        target = args.sources / name
        if target.exists() or archs.isdisjoint(readers) or not (args.mirrors / mirror).exists():
            continue
        repo = str(args.mirrors / mirror / "repo")
        commit = subprocess.run(["git", "--git-dir", repo, "rev-parse", "HEAD"], check=True,
                                capture_output=True, text=True).stdout.strip()  # fmt: skip
        git = ["git", "--git-dir", repo, "archive", commit, *folders]
        archive = subprocess.run(git, check=True, capture_output=True).stdout
        target.mkdir(parents=True)
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
        with open(args.sources / "REVISIONS", "a") as revisions:
            revisions.write(f"{name} {mirror.replace('+', '/')} {commit}\n")
    return args.sources


def reference(args) -> list[dict]:
    from tilestore.embed.slides import embed_slides, get_slide_encoder
    from tilestore.embeddings.slides import read_slide_vector
    from tilestore.exports.h5 import to_h5

    sources = fill_sources(args)
    rows, keys = [], {}
    for name in _wanted(args):
        spec = get_slide_encoder(name)
        model, mpp, tile, dim = tile_setup(spec)
        tiles = store_features(args.store, model, mpp, tile, dim)
        h5 = to_h5(args.store, model, args.work / "h5" / model, overwrite=True)
        torch_file = "gigapath" in name or name in ("madeleine", "chief")  # as published
        suffix = {"moozy": "pt", "cobra": "pth.tar"}.get(spec.arch)
        suffix = suffix or ("pth" if torch_file else "safetensors")
        weights = args.work / "weights" / f"{name}.{suffix}"
        precision = _reference_precision(spec, args)
        weights.parent.mkdir(parents=True, exist_ok=True)
        out = args.work / "vectors" / f"{name}.npy"
        out.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        cmd = [args.python, str(HERE / "slide_references.py"), name, str(h5.path), str(weights),
               str(out), "--sources", str(sources), "--trident", str(args.trident),
               "--device", args.device, "--precision", precision]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True)
        ref_s = time.perf_counter() - started
        if done.returncode:
            said = (done.stderr.strip() or done.stdout.strip()).splitlines()
            why = said[-1][:300] if said else f"exit {done.returncode}, nothing said"
            rows.append({"encoder": name, "tile_model": model, "tiles": tiles,
                         "error": why})  # fmt: skip
            print(f"{name}: reference failed: {rows[-1]['error']}", flush=True)
            continue
        started = time.perf_counter()
        given = None if spec.source == "none" else weights
        report = embed_slides(
            [args.store],
            name,
            model=None if spec.tile_model else model,
            device=args.device,
            precision=precision,
            overwrite=True,
            weights=given,
        )
        ours_s = time.perf_counter() - started
        if report.failures:
            raise SystemExit(report.failures[0].why)
        if given is not None:  # the authors' layout as their code saves it, for the tests
            keys[name] = _layout(given)
        ours = read_slide_vector(args.store, model, name)["vector"]
        theirs = np.load(out)
        cosine = float(ours @ theirs / (np.linalg.norm(ours) * np.linalg.norm(theirs)))
        rows.append(
            {
                "encoder": name,
                "tile_model": model,
                "tiles": tiles,
                "reference": spec.reference,
                "cosine": cosine,
                "max_abs_diff": float(np.abs(ours - theirs).max()),
                "dim": int(ours.size),
                "precision": precision,
                "device": args.device,
                "ours_s": round(ours_s, 2),
                "reference_s": round(ref_s, 2),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
        if spec.patients:
            rows.append(_patient_row(rows[-1], spec, args, weights, model, ours, out))
            print(json.dumps(rows[-1]), flush=True)
        chunked = out.with_name(f"{out.stem}-chunked.npy")
        if spec.arch == "cobra" and chunked.exists():  # the unfused Mamba2 path, likewise
            theirs = np.load(chunked)
            cosine = float(ours @ theirs / (np.linalg.norm(ours) * np.linalg.norm(theirs)))
            unfused = f"{spec.reference}; unfused: ssd_chunk_scan_combined_ref"
            rows.append({**rows[-1], "encoder": f"{name} (Mamba2 unfused)", "cosine": cosine,
                         "max_abs_diff": float(np.abs(ours - theirs).max()),
                         "reference": unfused})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    if args.keys:
        known = json.loads(args.keys.read_text()) if args.keys.exists() else {}
        args.keys.write_text(json.dumps({**known, **keys}, indent=1, sort_keys=True) + "\n")
    print()
    print("| encoder | tile model | tiles | reference | device, precision | cosine | max abs diff "
          "| dim |\n|---|---|---|---|---|---|---|---|")  # fmt: skip
    for r in rows:
        if "error" in r:
            failed = f"failed: {r['error']}"
            print(f"| {r['encoder']} | {r['tile_model']} | {r['tiles']:,} | {failed} | | | | |")
            continue
        print(f"| {r['encoder']} | {r['tile_model']} | {r['tiles']:,} | {r['reference']} | "
              f"{r['device']}, {r['precision']} | {r['cosine']:.7f} | {r['max_abs_diff']:.2e} | "
              f"{r['dim']} |")  # fmt: skip
    return rows


def _reference_precision(spec, args) -> str:
    """fp32 (--precision auto or fp32), the authors' (--precision authors), or as named."""
    if args.precision in ("auto", "fp32"):
        return "fp32"
    return spec.precision if args.precision == "authors" else args.precision


def _patient_row(row: dict, spec, args, weights: Path, model: str, ours, out: Path) -> dict:
    """The patient check of an encoder that makes patient vectors (MOOZY): a case of two
    slides, the store's and the store's with its tile features negated, through our
    encoder and patient model against the authors' `run_case_encoding` (written by the
    reference beside its slide vector)."""
    from dataclasses import replace

    import torch

    from tilestore.embed.slides import load_slide_encoder
    from tilestore.embed.slides.load import AUTOCAST
    from tilestore.embeddings.slides import read_tile_features

    device = torch.device(args.device)
    loaded = load_slide_encoder(spec, weights=weights, device=device)
    tiles = read_tile_features(args.store, model)
    negated = loaded.encode(replace(tiles, features=-np.asarray(tiles.features)), device,
                            row["precision"])  # fmt: skip
    dtype = AUTOCAST.get(row["precision"])
    with torch.inference_mode(), torch.autocast(device.type, dtype=dtype, enabled=bool(dtype)):
        slides = torch.from_numpy(np.stack([ours, negated])).to(device)
        mine = loaded.module.patient(slides).float().cpu().numpy()
    theirs = np.load(out.with_name(out.stem + "-patient.npy"))
    cosine = float(mine @ theirs / (np.linalg.norm(mine) * np.linalg.norm(theirs)))
    return {**row, "encoder": f"{spec.name} (patient of 2 slides)", "cosine": cosine,
            "max_abs_diff": float(np.abs(mine - theirs).max()), "dim": int(mine.size),
            "reference": "authors: MOOZY run_case_encoding (its case transformer)"}  # fmt: skip


def _layout(path: Path) -> dict[str, list[int]]:
    """A weights file's tensor names and shapes."""
    from tilestore.embed.models.hub import load_weights

    return {k: list(v.shape) for k, v in sorted(load_weights(path.stem, path).items())}


def measure(args) -> dict:
    """One encoder on N synthetic tiles, in this (fresh) process: seconds and peak memory."""
    import torch

    from tilestore.embed.slides import get_slide_encoder, load_slide_encoder
    from tilestore.embed.slides.load import AUTOCAST

    spec = get_slide_encoder(args.encoder)
    _, _, _, dim = tile_setup(spec)
    device = torch.device(args.device)
    side = int(np.ceil(np.sqrt(args.tiles)))
    cells = np.stack(np.divmod(np.arange(args.tiles), side)[::-1], axis=1)
    features = torch.from_numpy(_features(args.tiles, dim, "speed")).to(device)
    cells_t = torch.from_numpy(cells).to(device)
    encoder = load_slide_encoder(f"random:{spec.name}" if spec.source != "none" else spec.name,
                                 in_dim=dim, device=device)  # fmt: skip
    precision = _precision(spec.name, args)
    dtype = AUTOCAST.get(precision)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    times = []
    for _ in range(args.repeats + 1):
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        with (
            torch.inference_mode(),
            torch.autocast(device.type, dtype=dtype, enabled=dtype is not None),
        ):
            encoder.module(features, cells_t)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    peak = (
        torch.cuda.max_memory_allocated() / 2**20
        if device.type == "cuda"
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before
    )
    return {"encoder": spec.name, "tiles": args.tiles, "device": str(device),
            "precision": precision, "seconds": round(min(times[1:] or times), 3),
            "first_s": round(times[0], 3), "peak_mb": round(peak, 1)}  # fmt: skip


def _precision(name: str, args) -> str:
    """The precision a run uses: the authors' on CUDA unless one is given, fp32 on the CPU."""
    from tilestore.embed.slides import get_slide_encoder

    if args.precision != "auto":
        return args.precision
    return get_slide_encoder(name).precision if args.device.startswith("cuda") else "fp32"


def speed(args) -> list[dict]:
    if args.reference:
        fill_sources(args)
    rows = []
    for tiles in (int(t) for t in args.tiles.split(",")):
        for name in _wanted(args):
            if args.reference:  # the authors' code on the same N, in the references' process
                work = args.work / "synthetic"
                work.mkdir(parents=True, exist_ok=True)
                cmd = [args.python, str(HERE / "slide_references.py"), name, "-", str(work / "w"),
                       "-", "--sources", str(args.sources), "--trident",
                       str(args.trident), "--synthetic", str(tiles), "--limit-gb",
                       str(args.limit_gb), "--device", args.device,
                       "--precision", _precision(name, args)]  # fmt: skip
                done = subprocess.run(cmd, capture_output=True, text=True)
                found = (
                    json.loads(done.stdout.strip().splitlines()[-1])
                    if done.returncode == 0
                    else {"error": done.stderr.strip().splitlines()[-1][:200]}
                )
                row = {**found, "encoder": f"{name} (authors' code)", "tiles": tiles,
                       "device": args.device, "precision": _precision(name, args),
                       "first_s": found.get("seconds")}  # fmt: skip
                if row.get("error") is None:
                    row.pop("error", None)
                rows.append(row)
                print(json.dumps(row), flush=True)
            cmd = [sys.executable, __file__, "measure", "--encoder", name, "--tiles", str(tiles),
                   "--device", args.device, "--precision", args.precision,
                   "--repeats", str(args.repeats)]  # fmt: skip
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                row = {
                    "encoder": name,
                    "tiles": tiles,
                    "error": done.stderr.strip().splitlines()[-1][:200],
                }
            else:
                row = json.loads(done.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(json.dumps(row), flush=True)
    print()
    print("| encoder | tiles | device, precision | seconds | peak memory MB |")
    print("|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['encoder']} | {r['tiles']:,} | | {r['error']} | |")
        else:
            print(f"| {r['encoder']} | {r['tiles']:,} | {r['device']}, {r['precision']} | "
                  f"{r['seconds']:.2f} | {r['peak_mb']:,.0f} |")  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", choices=("reference", "speed", "measure", "sources"))
    parser.add_argument("--encoders", help="comma-separated (default: all registered)")
    parser.add_argument("--encoder", help="measure: the one encoder")
    parser.add_argument("--store", type=Path, default=HERE / "data/copied/large-40000.ome.zarr")
    parser.add_argument("--work", type=Path, default=Path("/tmp/slide-encoders"))
    parser.add_argument("--python", default=sys.executable, help="the references' interpreter")
    parser.add_argument("--trident", type=Path, default=REPO / ".peers/TRIDENT")
    parser.add_argument(
        "--sources",
        type=Path,
        default=REPO / ".slideref/sources",
        help="the authors' code the references read: one plain source tree per SOURCES entry "
        "(what it lacks of the wanted encoders' is copied from --mirrors first)",
    )
    parser.add_argument(
        "--mirrors",
        type=Path,
        default=Path("/work/.mirror"),
        help="git mirrors (OWNER+NAME/repo) to fill --sources from, where they exist",
    )
    parser.add_argument("--tiles", default="30000")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--precision",
        default="auto",
        help="speed: auto (the authors' on CUDA), fp32, bf16, fp16; reference: fp32 (auto), "
        "authors (each encoder's authors' precision, for a GPU), bf16, fp16",
    )
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--reference", action="store_true", help="speed: also the authors' code (CPU)"
    )
    parser.add_argument("--limit-gb", type=float, default=16.0, help="--reference's memory cap")
    parser.add_argument("--json", type=Path, default=HERE / "results" / "slide_encoders.json")
    parser.add_argument(
        "--keys",
        type=Path,
        default=REPO / "tests/embed/slide_encoder_keys.json",
        help="reference: record the authors' tensor names and shapes here (the tests load them)",
    )
    args = parser.parse_args()
    import torch  # the references' comparison is fp32 to the last bit: no TF32 on a GPU

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if args.mode == "measure":
        args.tiles = int(args.tiles)
        print(json.dumps(measure(args)))
        return
    if args.mode == "sources":
        revisions = fill_sources(args) / "REVISIONS"
        if not revisions.exists():
            raise SystemExit(f"--sources {args.sources}: nothing copied (none of the wanted "
                             f"encoders' code in --mirrors {args.mirrors})")  # fmt: skip
        print(revisions.read_text(), end="")
        return
    if args.mode == "reference" and not args.store.exists():
        from stores import build

        build(args.store.parents[1], 40000, ())
    rows = reference(args) if args.mode == "reference" else speed(args)
    found = json.loads(args.json.read_text()) if args.json.exists() else {}
    found[args.mode] = rows
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
