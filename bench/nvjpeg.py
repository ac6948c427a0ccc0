"""nvJPEG on store chunks (GPU machine): decode rate by call size, alone and beside a model.

Decodes the first `--chunks` chunks of a JPEG store level (default: bench/embed_engine.py's YCbCr
store) with `tilestore.embed.nvjpeg.decode_gpu`, in calls of 16 .. 1024 chunks, and reports chunks/s
and megapixels/s; then once more beside a thread that only runs Python and beside a model
running batches on the GPU, to show what the decoder takes from it and it from the decoder
(the model's tiles/s alone and beside the decodes). This is what
`tilestore.embed.nvjpeg.GROUP_PIXELS` rests on. Last, the same tissue re-encoded in chunks of
`--sides` px (quality 90), to show what the chunk size does to nvJPEG: its cost per image, not per
pixel, is what limits it on small chunks.

`--decoders` compares several (ours on the JPEG engines or on CUDA, nvImageCodec's engines)
on the same chunks, with how busy NVML says the engines were.

    python bench/nvjpeg.py [--store S] [--sides 256,512,1024] [--out x.json]
    python bench/nvjpeg.py --store bench/data/copied/large-40000.ome.zarr \
        --decoders OwnNvjpeg,OwnNvjpegCuda,NvImageCodec --sides 1024
"""

from __future__ import annotations

import argparse
import collections
import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import imagecodecs
import numpy as np
import timm
import torch
from gpu_decoders import gpu_decoder

from tilestore.embed.nvjpeg import (
    OwnNvjpeg,
    decode_gpu,
    gpu_decode_agrees,
    group_chunks,
    open_decoder,
)
from tilestore.reading.opening import open_slide

HERE = Path(__file__).resolve().parent


def decode_rate(decoder, reader, data: list[bytes], group: int, device: torch.device) -> float:
    """Chunks/s decoding `data` in calls of `group`, on a stream of its own."""
    with torch.cuda.stream(torch.cuda.Stream(device)):
        decode_gpu(decoder, reader, data[:group], device)  # set up for this call size
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for start in range(0, len(data), group):
            decode_gpu(decoder, reader, data[start : start + group], device)
        torch.cuda.synchronize(device)
    return len(data) / (time.perf_counter() - t0)


def same_tissue(reader, side: int, squares: int = 4, square: int = 4096) -> list[bytes]:
    """`squares` squares of `square` px along the level's diagonal, re-encoded as JPEGs of
    side x side px (quality 90, 4:2:0): the same tissue in chunks of another size."""
    n = square // reader.chunk_h
    out = []
    for k in range(squares):
        r0 = (k + 1) * reader.grid[0] // (squares + 1) - n // 2
        c0 = (k + 1) * reader.grid[1] // (squares + 1) - n // 2
        rows = [
            np.concatenate(
                [reader.decode(d) for d in reader.fetch([(r0 + i, c0 + j) for j in range(n)])],
                axis=1,
            )
            for i in range(n)
        ]
        image = np.concatenate(rows, axis=0)
        whole = image.shape[0] // side * side  # n chunks may fall short of `square`
        for y in range(0, whole, side):
            for x in range(0, whole, side):
                out.append(imagecodecs.jpeg8_encode(image[y : y + side, x : x + side], level=90))
    return out


def chunk_sizes(decoder, reader, sides: list[int], model, device, tissue: dict) -> dict:
    """Mpx/s decoding the same tissue in chunks of each side, alone and beside the model
    (2 batches in flight, as the engine), in calls of about GROUP_PIXELS."""
    found = {}
    for side in sides:
        data = tissue[side]
        resized = SimpleNamespace(
            chunk_h=side,
            chunk_w=side,
            color_space="ycbcr",
            channels=3,
            background=255,
            where=f"{side} px re-encodes",
        )
        group = group_chunks(side, side)
        px = side * side / 1e6
        alone = best_rate(decoder, resized, data, group, device, 3.0)
        rate, other = beside(
            lambda stop: model_rate(model, device, stop, 2),
            decoder,
            resized,
            data,
            device,
            group=group,
        )
        found[side] = {
            "chunks": len(data),
            "mean_bytes": sum(map(len, data)) / len(data),
            "alone_mpx_per_s": alone * px,
            "beside_model_mpx_per_s": rate * px,
            "model_tiles_per_s": other,
        }
        print(
            f"{side} px | {alone * px:.0f} Mpx/s alone ({alone:.0f} chunks/s) | "
            f"{rate * px:.0f} Mpx/s beside the model ({rate:.0f} chunks/s), model {other:.0f}"
        )
    return found


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


def beside(
    work, decoder, reader, data, device, seconds: float = 3.0, group: int = 256
) -> tuple[float, float]:
    """(decode chunks/s in calls of `group`, work's result) while `work(stop)` runs on a
    thread."""
    stop, out = threading.Event(), {}
    thread = threading.Thread(target=lambda: out.update(result=work(stop)))
    thread.start()
    rate = best_rate(decoder, reader, data, group, device, seconds)
    stop.set()
    thread.join()
    return rate, out["result"]


def best_rate(decoder, reader, data, group: int, device, seconds: float) -> float:
    """The best chunks/s of passes over `data` for `seconds`: short passes are noisy."""
    rates, t0 = [], time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        rates.append(decode_rate(decoder, reader, data, group, device))
    return max(rates)


class JpegEngineLoad:
    """Mean use of the GPU's JPEG engines (NVML's JPG utilisation, percent) while the block
    runs, sampled every 50 ms; None where NVML cannot tell."""

    def __init__(self, device: torch.device) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
            self.read = lambda: pynvml.nvmlDeviceGetJpgUtilization(self.handle)[0]
            self.read()
        except Exception:  # no pynvml, or a driver without the counter
            self.read = None
        self.mean: float | None = None

    def __enter__(self) -> JpegEngineLoad:
        self.samples, self.stop = [], threading.Event()
        if self.read is not None:
            self.thread = threading.Thread(target=self._sample, daemon=True)
            self.thread.start()
        return self

    def _sample(self) -> None:
        while not self.stop.wait(0.05):
            self.samples.append(self.read())

    def __exit__(self, *exc) -> None:
        self.stop.set()
        if self.read is not None:
            self.thread.join()
            self.mean = sum(self.samples) / len(self.samples) if self.samples else None


def make_decoder(name: str, device: torch.device):
    """A decoder by class name (`gpu_decoders.gpu_decoder`); "OwnNvjpegCuda": ours on
    nvJPEG's CUDA backend (no JPEG engine), to compare the two backends."""
    if name == "OwnNvjpegCuda":
        return OwnNvjpeg(device, hardware=False)
    return gpu_decoder(name)(device)


def probe(decoder, reader, data, model, device, sides, tissue) -> dict:
    """One decoder: by call size alone, beside a Python thread and the model, and by chunk
    size (the same tissue re-encoded)."""
    px = reader.chunk_h * reader.chunk_w / 1e6
    found = {"decoder": decoder.name, "engines": getattr(decoder, "engines", None), "alone": {}}
    sample = [
        (r, c) for r in range(reader.grid[0] // 2, reader.grid[0]) for c in (reader.grid[1] // 2,)
    ]
    found["mean_abs_diff_vs_libjpeg"] = gpu_decode_agrees(decoder, reader, sample, device)
    print(
        f"== {decoder.name} (engines, cores: {found['engines']}); a chunk's mean |difference| "
        f"from libjpeg's decode: {found['mean_abs_diff_vs_libjpeg']:.3f} levels"
    )
    print("call size | chunks/s | Mpx/s")
    for group in (16, 64, 256, 1024):
        load = JpegEngineLoad(device)
        with load:
            rate = decode_rate(decoder, reader, data, group, device)
        found["alone"][group] = {"chunks_per_s": rate, "jpg_util": load.mean}
        print(f"{group} | {rate:.0f} | {rate * px:.0f} | JPEG engines {load.mean}% busy")
    cases = {
        "a Python thread": busy,
        "the model, 2 batches in flight (as the engine)": (
            lambda stop: model_rate(model, device, stop, 2)
        ),
    }
    found["beside"] = {}
    for name, work in cases.items():
        load = JpegEngineLoad(device)
        with load:
            rate, other = beside(work, decoder, reader, data, device)
        found["beside"][name] = {"decode_chunks_per_s": rate, "other": other, "jpg_util": load.mean}
        tail = f"; model {other:.0f} tiles/s" if "model" in name else ""
        print(f"  beside {name}: decode {rate:.0f} chunks/s{tail}; engines {load.mean}% busy")
    if sides:
        print("the same tissue in chunks of other sizes:")
        found["chunk_sizes"] = chunk_sizes(decoder, reader, sides, model, device, tissue)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", type=Path, default=HERE / "data/ycbcr-512/large-40000.ome.zarr")
    parser.add_argument("--chunks", type=int, default=4096)
    parser.add_argument("--model", default="vit_small_patch16_224")
    parser.add_argument("--sides", default="256,512,1024", help="chunk sizes to compare")
    parser.add_argument(
        "--decoders",
        default="",
        help="decoders to compare, by class name (tilestore.embed.nvjpeg's, gpu_decoders.py's "
        "NvImageCodec, or OwnNvjpegCuda: ours on nvJPEG's CUDA backend); default: the "
        "engine's, the first that works",
    )
    parser.add_argument("--out", type=Path, default=HERE / "results" / "nvjpeg.json")
    args = parser.parse_args()
    device = torch.device("cuda", torch.cuda.current_device())
    reader = open_slide(args.store).chunks(0)
    coords = [(r, c) for r in range(reader.grid[0]) for c in range(reader.grid[1])]
    data = [d for d in reader.fetch(coords[: 2 * args.chunks]) if d is not None][: args.chunks]
    print(f"{len(data)} chunks of {reader.chunk_h}x{reader.chunk_w} from {args.store}")
    model = timm.create_model(args.model).to(device).eval().to(memory_format=torch.channels_last)
    alone = model_rate_for(model, device, 3.0)
    print(f"{args.model} alone: {alone:.0f} tiles/s")
    sides = [int(v) for v in args.sides.split(",") if v]
    tissue = {side: same_tissue(reader, side) for side in sides}
    results = {
        "store": str(args.store),
        "chunk": [reader.chunk_h, reader.chunk_w],
        "model": {"name": args.model, "alone_tiles_per_s": alone},
        "decoders": {},
    }
    names = [n for n in args.decoders.split(",") if n] or [type(open_decoder(device)).__name__]
    for name in names:
        try:
            decoder = make_decoder(name, device)
        except (RuntimeError, OSError) as exc:
            print(f"== {name}: does not start ({exc})")
            results["decoders"][name] = {"error": str(exc)}
            continue
        try:
            results["decoders"][name] = probe(decoder, reader, data, model, device, sides, tissue)
        except (RuntimeError, ValueError) as exc:
            print(f"== {name}: failed ({exc})")
            results["decoders"][name] = {"error": str(exc)}
        finally:
            decoder.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"JSON: {args.out}")


if __name__ == "__main__":
    main()
