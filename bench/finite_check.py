"""What the finiteness checks cost: the engine's per batch beside the model, a reader's per
slide beside reading the features.

engine - one batch through the model (`tilestore.embed.forward.Forward`, eager), and the
         check `tilestore.embed.runner.Runner` adds after it: the rows cast to the stored
         dtype, `torch.isfinite(...).all()`, the flag copied to (pinned) host memory behind
         them; on a GPU both timed by CUDA events over `--repeats` batches, on the CPU by
         the clock. The share is check / forward.
reader - a slide's features as the writer stores them (zarr, shards of whole batches, zstd
         1), read whole (`read_tile_features` does), and `tilestore.embeddings.groups.
         all_finite` on them (numpy's isfinite for float32, the bits for float16).

    python bench/finite_check.py --models efficientnet-lite0 --batch 32          # the CPU
    python bench/finite_check.py --models random:vit_small_patch16_224,random:vit_large_patch16_224
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import zarr

from tilestore.embed.forward import Forward, place
from tilestore.embed.models import load_model
from tilestore.embeddings.groups import all_finite
from tilestore.format.codecs import zstd_codecs
from tilestore.format.shards import sharded


def timed(fn, repeats: int, cuda: bool) -> float:
    """ms per call of fn() (after 3 calls), by CUDA events on a GPU, else the clock."""
    for _ in range(3):
        fn()
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / repeats
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - started) * 1000 / repeats


def engine(model: str, batch: int, device: torch.device, dtype: str, repeats: int) -> dict:
    cuda = device.type == "cuda"
    loaded = place(load_model(model, device=device), device)
    forward = Forward(loaded, device, "bf16" if cuda else "fp32", compile=False)
    side = loaded.transform.input_size
    tiles = torch.randint(0, 256, (batch, side, side, 3), dtype=torch.uint8, device=device)
    stored = getattr(torch, dtype)
    rows = forward(tiles, batch).to(stored)
    flag = torch.ones((), dtype=torch.bool, pin_memory=cuda)

    def check():  # as Runner._compute_batch and Runner._finite do it
        flag.copy_(
            torch.isfinite(rows[:, : forward.stored_width].to(stored)).all(), non_blocking=cuda
        )

    forward_ms = timed(lambda: forward(tiles, batch), repeats, cuda)
    check_ms = timed(check, repeats * 10, cuda)
    return {
        "model": model,
        "device": torch.cuda.get_device_name(device) if cuda else platform.processor() or "cpu",
        "batch": batch,
        "dim": forward.width,
        "dtype": dtype,
        "forward_ms": round(forward_ms, 3),
        "check_ms": round(check_ms, 4),
        "share": round(check_ms / forward_ms, 5),
    }


def reader(tiles: int, dim: int, dtype: str, batch: int = 256) -> dict:
    rng = np.random.default_rng(0)
    values = rng.standard_normal((tiles, dim)).astype(dtype)
    with tempfile.TemporaryDirectory() as folder:
        array = zarr.create_array(
            Path(folder) / "features",
            shape=values.shape,
            dtype=dtype,
            **sharded(zstd_codecs(level=1), (batch, dim), (16 * batch, dim), True),
        )
        array[:] = values
        read_ms = timed(lambda: array[:], 3, False)
        check_ms = timed(lambda: all_finite(values), 3, False)
    return {
        "tiles": tiles,
        "dim": dim,
        "dtype": dtype,
        "read_ms": round(read_ms, 1),
        "check_ms": round(check_ms, 1),
        "share": round(check_ms / read_ms, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="efficientnet-lite0")
    parser.add_argument("--batch", type=int, default=None, help="256 on a GPU, 32 on the CPU")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=None, help="100 on a GPU, 5 on the CPU")
    parser.add_argument("--reader-tiles", type=int, default=50_000)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "finite.json"
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    batch = args.batch or (256 if cuda else 32)
    repeats = args.repeats or (100 if cuda else 5)
    runs = [engine(m, batch, device, args.dtype, repeats) for m in args.models.split(",")]
    print(
        f"{'model':36} {'device':24} {'batch':>5} {'forward ms':>11} {'check ms':>9} {'share':>8}"
    )
    for r in runs:
        print(f"{r['model']:36} {r['device'][:24]:24} {r['batch']:>5} {r['forward_ms']:>11.2f} "
              f"{r['check_ms']:>9.4f} {r['share']:>8.2%}")  # fmt: skip
    reads = [
        reader(args.reader_tiles, dim, dt) for dim in (768, 1536) for dt in ("float16", "float32")
    ]
    print(f"\n{'tiles':>7} {'dim':>5} {'dtype':8} {'read ms':>8} {'check ms':>9} {'share':>6}")
    for r in reads:
        print(f"{r['tiles']:>7} {r['dim']:>5} {r['dtype']:8} {r['read_ms']:>8.1f} "
              f"{r['check_ms']:>9.1f} {r['share']:>6.1%}")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"engine": runs, "reader": reads}, indent=1))


if __name__ == "__main__":
    main()
