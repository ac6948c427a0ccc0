"""nvJPEG on store chunks (GPU machine): decode rate by call size, alone and beside a model.

Decodes the first `--chunks` chunks of a JPEG store level (default: bench/embed.py's YCbCr
store) with `embed.nvjpeg.decode_gpu`, in calls of 16 .. 1024 chunks, and reports chunks/s
and megapixels/s; then once more while a model runs batches on the GPU, to show what the
decoder takes from it (the model's tiles/s alone and beside the decodes). This is what
`embed.nvjpeg.GROUP_PIXELS` rests on.

    python bench/nvjpeg.py [--store S] [--model vit_small_patch16_224] [--out x.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import threading
import time
from pathlib import Path

# Python put this folder first on sys.path, where "embed" is bench/embed.py: move it last.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]

import timm
import torch

from embed.nvjpeg import decode_gpu, warm_up
from tilestore.slide import open_slide


def decode_rate(reader, data: list[bytes], group: int, device: torch.device) -> float:
    """Chunks/s decoding `data` in calls of `group`, on a stream of its own."""
    with torch.cuda.stream(torch.cuda.Stream(device)):
        decode_gpu(reader, data[:group], device)  # the batched decoder set up for this size
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for start in range(0, len(data), group):
            decode_gpu(reader, data[start : start + group], device)
        torch.cuda.synchronize(device)
    return len(data) / (time.perf_counter() - t0)


def model_rate(model, device, stop: threading.Event, in_flight: int | None) -> float:
    """Tiles/s of the model on bf16 input on the GPU until `stop`; with `in_flight`, no more
    batches queued at once (as the engine does), else launched as fast as Python can."""
    x = torch.randn(256, 3, 224, 224, device=device).contiguous(memory_format=torch.channels_last)
    n, flight = 0, collections.deque()
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
        model(x)
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        while not stop.is_set():
            while in_flight and len(flight) >= in_flight:
                flight.popleft().synchronize()
            model(x)
            flight.append(torch.cuda.Event())
            flight[-1].record()
            n += len(x)
        torch.cuda.synchronize(device)
    return n / (time.perf_counter() - t0)


def busy(stop: threading.Event) -> float:
    """A thread that only runs Python (holds the GIL), for comparison."""
    n = 0
    while not stop.is_set():
        n += sum(range(1000))
    return n


def model_rate_for(model, device, seconds: float) -> float:
    stop = threading.Event()
    threading.Timer(seconds, stop.set).start()
    return model_rate(model, device, stop, 2)


def beside(work, reader, data, device, seconds: float = 3.0) -> tuple[float, float]:
    """(decode chunks/s in calls of 256, work's result) while `work(stop)` runs on a thread."""
    stop, out = threading.Event(), {}
    thread = threading.Thread(target=lambda: out.update(result=work(stop)))
    thread.start()
    rates, t0 = [], time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        rates.append(decode_rate(reader, data, 256, device))
    stop.set()
    thread.join()
    return max(rates), out["result"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", type=Path, default=HERE / "data/ycbcr/large-40000.ome.zarr")
    parser.add_argument("--chunks", type=int, default=4096)
    parser.add_argument("--model", default="vit_small_patch16_224")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "nvjpeg.json")
    args = parser.parse_args()
    device = torch.device("cuda", torch.cuda.current_device())
    reader = open_slide(args.store).chunks(0)
    coords = [(r, c) for r in range(reader.grid[0]) for c in range(reader.grid[1])]
    data = [d for d in reader.fetch(coords[: 2 * args.chunks]) if d is not None][: args.chunks]
    warm_up(device)
    px = reader.chunk_h * reader.chunk_w / 1e6
    print(f"{len(data)} chunks of {reader.chunk_h}x{reader.chunk_w} from {args.store}")
    results = {"store": str(args.store), "chunk": [reader.chunk_h, reader.chunk_w], "alone": {}}
    print("call size | chunks/s | Mpx/s")
    for group in (16, 64, 128, 256, 512, 1024):
        rate = decode_rate(reader, data, group, device)
        results["alone"][group] = rate
        print(f"{group} | {rate:.0f} | {rate * px:.0f}")
    model = timm.create_model(args.model).to(device).eval().to(memory_format=torch.channels_last)
    alone = model_rate_for(model, device, 3.0)
    results["model"] = {"name": args.model, "alone_tiles_per_s": alone}
    print(f"{args.model} alone: {alone:.0f} tiles/s; decodes (calls of 256) beside:")
    cases = {
        "a Python thread": busy,
        "the model, 2 batches in flight (as the engine)": (
            lambda stop: model_rate(model, device, stop, 2)
        ),
        "the model, launched freely": lambda stop: model_rate(model, device, stop, None),
    }
    results["beside"] = {}
    for name, work in cases.items():
        rate, other = beside(work, reader, data, device)
        results["beside"][name] = {"decode_chunks_per_s": rate, "other": other}
        tail = f"; model {other:.0f} tiles/s" if "model" in name else ""
        print(f"  {name}: decode {rate:.0f} chunks/s{tail}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"JSON: {args.out}")


if __name__ == "__main__":
    main()
