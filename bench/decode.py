"""How fast the engine's decode paths can feed the GPU (GPU machine), with no model.

For each store of bench/embed_engine.py (the copied Aperio store, 240 px RGB-coded chunks, and
the YCbCr re-encodes), the engine's row source for `--decode cpu`
(`tilestore.embed.rows.ProcessRows`: worker processes, shared blocks, DMA) and, on YCbCr stores,
for `--decode gpu` (`tilestore.embed.rows.NvjpegRows`) hands over every grid row of the 'bench'
plan in order, as the producer takes them, as fast as they come. Tiles/s here is the most the path
can feed a model: compare it with a model's ceiling (bench/embed_engine.py) to see which side
limits.

    python bench/decode.py [--workers 14] [--reps 2] [--out x.json]
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path

import torch
from stores import build

from tilestore.cpus import usable_cpus
from tilestore.embed.nvjpeg import open_decoder
from tilestore.embed.procdecode import ProcessDecoder
from tilestore.embed.rows import NvjpegRows, ProcessRows
from tilestore.embed.settings import Options, Settings
from tilestore.plan import load_plan
from tilestore.plan.tiles import chunk_schedule
from tilestore.reading.opening import open_slide

HERE = Path(__file__).resolve().parent


def feed(store: Path, path: str, workers: int, device: torch.device) -> dict:
    """Tiles/s of one pass over the store's plan through the row source `path`."""
    slide = open_slide(store)
    plan, _ = load_plan(slide, "bench")
    reader = slide.chunks(plan.spec.level)
    steps = chunk_schedule(plan)
    timed = lambda *a: None  # noqa: E731 - the stage timings are the engine's business
    procs = ProcessDecoder(workers) if path == "cpu" else None
    # what the engine runs with: 4 readers, batches of 1,024 (the first rows split as for one)
    settings = Settings(
        device=device,
        precision="bf16",
        decode=path,
        gpu_decoder=None,
        decoders=workers,
        batch_size=1024,
        options=Options(readers=4, prefetch=4, dtype="float16"),
    )
    try:
        if procs is not None:
            procs.wait_ready()
            source = ProcessRows(steps, settings, timed, reader, procs, threading.Event())
        else:
            source = NvjpegRows(steps, settings, timed, reader, open_decoder(device))
        t0 = time.perf_counter()
        with source:
            for index in range(len(steps)):
                source.take(index)
        torch.cuda.synchronize(device)
        seconds = time.perf_counter() - t0
    finally:
        if procs is not None:
            procs.close()
    chunks = sum(len(step.load) for step in steps)
    return {
        "tiles": len(plan),
        "chunks": chunks,
        "chunk_px": reader.chunk_h,
        "seconds": round(seconds, 3),
        "tiles_per_s": round(len(plan) / seconds),
        "chunks_per_s": round(chunks / seconds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", type=int, default=40_000)
    parser.add_argument("--ycbcr-chunks", default="512,1024")
    parser.add_argument("--workers", type=int, default=max(2, usable_cpus() - 2))
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--work", type=Path, default=HERE / "data")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "decode.json")
    args = parser.parse_args()
    device = torch.device("cuda", torch.cuda.current_device())
    chunks = tuple(int(c) for c in args.ycbcr_chunks.split(","))
    _, copied, ycbcrs = build(args.work, args.size, chunks)
    cases = [("copied", copied, "cpu")]
    for chunk, store in zip(chunks, ycbcrs, strict=True):
        cases += [(f"ycbcr-{chunk}", store, "cpu"), (f"ycbcr-{chunk}", store, "gpu")]
    results = {
        "machine": {"gpu": torch.cuda.get_device_name(device), "cpus": os.cpu_count()},
        "workers": args.workers,
        "runs": [],
    }
    for rep in range(args.reps):  # interleaved: the machine's drift hits every case alike
        for name, store, path in cases:
            run = {"store": name, "decode": path, "rep": rep}
            run.update(feed(store, path, args.workers, device))
            print(json.dumps(run), flush=True)
            results["runs"].append(run)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(results, indent=2))
    machine = results["machine"]
    print(f"\n{machine['gpu']}, {machine['cpus']} CPUs, {args.workers} decoder processes")
    print("store | decode | chunk px | tiles/s (each rep) | chunks/s (best)")
    for name, _, path in cases:
        runs = [r for r in results["runs"] if r["store"] == name and r["decode"] == path]
        rates = ", ".join(f"{r['tiles_per_s']:,}" for r in runs)
        best = max(r["chunks_per_s"] for r in runs)
        print(f"{name} | {path} | {runs[0]['chunk_px']} | {rates} | {best:,}")
    print(f"JSON: {args.out}")


if __name__ == "__main__":
    main()
