"""One slide, whole job, against a peer (GPU machine): wall per tile, each tool as its README says.

Every arm is a fresh process from the slide file to embeddings on disk, timed from outside:
  tilestore           - `tilestore embed SLIDE --model random:ARCH --into DIR` (convert, tissue,
                        plan, embed in one process); "first" with no batch-size memo and no
                        caches, "again" with the memo the first left (a SLURM array's later
                        tasks); "in place" reads the SVS through a sidecar, no conversion;
  TRIDENT             - mahmoodlab/TRIDENT from a local copy of its source (`--trident DIR`; it
                        is not on PyPI): `run_batch_of_slides.py --task all` as its README gives
                        it (20x, 256 px patches, batch 64), with its Otsu segmenter (its default
                        HEST segmenter downloads weights from the hub, which this bench cannot
                        reach) and the patch encoder of the same architecture, random weights
                        saved to a local checkpoint (`--patch_encoder_ckpt_path`).

Each pair runs the same timm architecture with random weights (cost is the architecture's, not
the weights'): ViT-L/16 is TRIDENT's `uni_v1` (fp16, as TRIDENT runs it), ViT-S/16 its
`kaiko-vits16` (fp32, as TRIDENT runs it). Tiles differ (TRIDENT: 256 px at 20x, resized to
224; ours: the model's 224 px at its native 0.5 um/px): hence wall per tile.

    python bench/peers.py --trident ../TRIDENT --slide bench/data/large-40000.svs
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))


@dataclass(frozen=True)
class Pair:
    """One architecture as each tool names it."""

    arch: str  # timm architecture (ours: random:<arch>)
    trident: str  # TRIDENT's patch encoder of that architecture
    timm_kwargs: dict  # how TRIDENT builds it, so its checkpoint loads strictly


PAIRS = {
    "vit_large_patch16_224": Pair(
        "vit_large_patch16_224",
        "uni_v1",
        {
            "img_size": 224,
            "patch_size": 16,
            "init_values": 1e-5,
            "num_classes": 0,
            "dynamic_img_size": True,
        },
    ),
    "vit_small_patch16_224": Pair(
        "vit_small_patch16_224",
        "kaiko-vits16",
        {"num_classes": 0, "img_size": 224, "dynamic_img_size": True},
    ),
}


@dataclass
class Arm:
    tool: str
    arch: str
    tiles: int
    wall_s: float
    note: str = ""

    @property
    def ms_per_tile(self) -> float:
        return 1000 * self.wall_s / self.tiles if self.tiles else float("nan")


def timed(cmd: list[str], env: dict, cwd: Path | None = None, log: Path | None = None) -> float:
    """Run cmd in a fresh process; its wall seconds (stdout and stderr kept in log)."""
    started = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if log is not None:
        log.write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return wall


def ours(pair: Pair, slide: Path, work: Path, env: dict, name: str, *extra: str) -> Arm:
    stem = f"ours-{pair.arch}-{name.replace(' ', '-')}"
    into = work / stem
    shutil.rmtree(into, ignore_errors=True)
    report = work / f"{stem}.json"
    cmd = [
        sys.executable,
        "-m",
        "tilestore.cli",
        "embed",
        str(slide),
        "--model",
        f"random:{pair.arch}",
        "--into",
        str(into),
        "--report",
        str(report),
        *extra,
    ]
    wall = timed(cmd, env, cwd=REPO, log=work / f"{stem}.log")
    r = json.loads(report.read_text())
    note = f"batch {r['batch_size']}, engine {r['wall_s']:.1f} s, GPU busy {r['gpu_busy_fraction']}"
    return Arm(f"tilestore, {name}", pair.arch, r["tiles"], round(wall, 2), note)


def trident_checkpoint(pair: Pair, work: Path) -> Path:
    """Random weights of TRIDENT's architecture, saved where its loader reads a local file."""
    import timm
    import torch

    path = work / f"{pair.trident}-random.pth"
    if not path.exists():
        model = timm.create_model(pair.arch, pretrained=False, **pair.timm_kwargs)
        torch.save(model.state_dict(), path)
    return path


def trident(pair: Pair, slide: Path, work: Path, env: dict, source: Path, batch: int) -> Arm:
    import h5py

    wsis, job = work / "trident-wsis", work / f"trident-{pair.arch}"
    wsis.mkdir(exist_ok=True)
    link = wsis / slide.name
    if not link.exists():
        link.symlink_to(slide.resolve())
    shutil.rmtree(job, ignore_errors=True)
    ckpt = trident_checkpoint(pair, work)
    cmd = [
        sys.executable,
        "run_batch_of_slides.py",
        "--task",
        "all",
        "--wsi_dir",
        str(wsis),
        "--job_dir",
        str(job),
        "--patch_encoder",
        pair.trident,
        "--patch_encoder_ckpt_path",
        str(ckpt),
        "--mag",
        "20",
        "--patch_size",
        "256",
        "--segmenter",
        "otsu",
        "--batch_size",
        str(batch),
    ]
    penv = {**env, "PYTHONPATH": os.pathsep.join([str(source), env.get("PEERS_PATH", "")])}
    wall = timed(cmd, penv, cwd=source, log=work / f"trident-{pair.arch}.log")
    features = sorted(job.glob(f"**/features_{pair.trident}/*.h5"))
    if not features:
        raise SystemExit(f"TRIDENT wrote no features under {job}: see its log")
    with h5py.File(features[0]) as f:
        tiles = len(f["features"])
    return Arm("TRIDENT", pair.arch, tiles, round(wall, 2), f"batch {batch}, Otsu tissue")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trident", type=Path, required=True, help="a copy of TRIDENT's source")
    parser.add_argument("--slide", type=Path, default=HERE / "data" / "large-40000.svs")
    parser.add_argument("--size", type=int, default=40_000)
    parser.add_argument("--archs", default="vit_large_patch16_224,vit_small_patch16_224")
    parser.add_argument("--batch", type=int, default=64, help="TRIDENT's --batch_size")
    parser.add_argument("--work", type=Path, default=Path("/tmp/peers"))
    parser.add_argument("--out", type=Path, default=HERE / "results" / "peers.json")
    args = parser.parse_args()
    if not (args.trident / "run_batch_of_slides.py").exists():
        raise SystemExit(f"{args.trident}: no run_batch_of_slides.py (a copy of TRIDENT's source)")
    if not args.slide.exists():
        from bench.make_slide import make_large_svs

        args.slide.parent.mkdir(parents=True, exist_ok=True)
        make_large_svs(args.slide, args.size)
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    slide = args.work / args.slide.name  # a link: sidecars and outputs stay in the work folder
    slide.symlink_to(args.slide.resolve())
    env = {
        **os.environ,
        "TILESTORE_CACHE": str(args.work / "cache"),
        "TORCHINDUCTOR_CACHE_DIR": str(args.work / "inductor"),
        "HF_HUB_OFFLINE": "1",
    }
    # as a pip-installed environment runs: bytecode cached (the lent GPU machine sets this,
    # and its torch has no .pyc: every process of either tool would compile torch's sources)
    env.pop("PYTHONDONTWRITEBYTECODE", None)

    arms: list[Arm] = []

    def record(arm: Arm) -> None:
        arms.append(arm)
        print(json.dumps({**asdict(arm), "ms per tile": round(arm.ms_per_tile, 3)}), flush=True)
        for sidecar in args.work.glob("*.tilestore*"):
            shutil.rmtree(sidecar)  # the in-place sidecar: the next arm starts bare

    for arch in args.archs.split(","):
        pair = PAIRS[arch]
        record(trident(pair, slide, args.work, env, args.trident.resolve(), args.batch))
        record(ours(pair, slide, args.work, env, "first"))
        record(ours(pair, slide, args.work, env, "again"))
        record(ours(pair, slide, args.work, env, "in place", "--in-place"))

    rows = []
    for a in arms:
        peer = next(p for p in arms if p.tool == "TRIDENT" and p.arch == a.arch)
        rows.append(
            {
                **asdict(a),
                "ms per tile": round(a.ms_per_tile, 3),
                "per tile vs TRIDENT": round(a.ms_per_tile / peer.ms_per_tile, 2),
            }
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"slide": str(args.slide), "arms": rows}, indent=2))
    print(f"\nOne slide ({args.slide.name}), whole job, fresh processes")
    print("| tool | model | tiles | wall s | ms per tile | per tile vs TRIDENT | note |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['tool']} | {r['arch']} | {r['tiles']:,} | {r['wall_s']} | "
            f"{r['ms per tile']} | {r['per tile vs TRIDENT']} | {r['note']} |"
        )


if __name__ == "__main__":
    main()
