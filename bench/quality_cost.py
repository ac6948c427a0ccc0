"""What the per-tile quality measures cost beside a model on the GPU, and where it goes.

For one batch of 224 px tiles on the GPU, each timed as the engine runs it (compiled and
replayed as one CUDA graph; `tilestore.embed.forward.Forward`):

  model          - the model alone (ViT-S, ViT-B, ...), ms per batch;
  model+measures - the model with the measures in the same graph, for each way of
                   computing the band-pass blur (the measures' largest part):
                     conv    - two depthwise convolutions per Gaussian (cuDNN);
                     slices  - the Gaussian as a sum of shifted slices, which the compiler
                               fuses into its own kernels (slices16: on fp16 images);
                     matmul  - the Gaussian as a banded matrix (edges reflected) on each
                               side of the tile: two fp16 matrix products on the tensor
                               cores, fp32 accumulation;
  measures       - the measures alone, compiled and graphed, and eager;
  overlap        - the model and the measures in one graph, the measures on a second stream
                   (what running beside the model rather than after it would save);
  kernels        - the compiled measures' CUDA kernels by time (torch.profiler).

    python bench/quality_cost.py --models vit_small_patch16_224,vit_base_patch16_224
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import tilestore.qc.tilewise as tilewise
from tilestore.embed.forward import Forward, QualityLayout
from tilestore.embed.graphs import GraphedForward
from tilestore.embed.models import load_model
from tilestore.qc.colour import ColourTables


def _taps(sigma: float, size: int) -> tuple[int, list[float]]:
    radius = min(max(1, math.ceil(3 * sigma)), size - 1)
    taps = [math.exp(-0.5 * (t / sigma) ** 2) for t in range(-radius, radius + 1)]
    return radius, [t / sum(taps) for t in taps]


def blur_slices(images: torch.Tensor, sigma: float) -> torch.Tensor:
    if sigma < 0.3:
        return images
    _, h, w = images.shape
    radius, taps = _taps(sigma, min(h, w))
    x = F.pad(images[:, None], [radius] * 4, mode="reflect")[:, 0]
    rows = sum(k * x[:, :, i : i + w] for i, k in enumerate(taps))
    return sum(k * rows[:, i : i + h, :] for i, k in enumerate(taps))


def blur_matmul(images: torch.Tensor, sigma: float) -> torch.Tensor:
    if sigma < 0.3:
        return images
    _, h, w = images.shape
    rows = _matrix(w, sigma, images.device)
    cols = rows if h == w else _matrix(h, sigma, images.device)
    x = torch.matmul(images.half(), rows.t().half())
    return torch.matmul(cols.half(), x).float()


def _matrix(size: int, sigma: float, device) -> torch.Tensor:
    """(size, size): out[i] = sum_j m[i, j] x[j], the Gaussian with edges reflected."""
    radius, taps = _taps(sigma, size)
    i = torch.arange(size, device=device)[:, None]
    j = (i + torch.arange(-radius, radius + 1, device=device)[None]).abs()
    j = torch.where(j >= size, 2 * (size - 1) - j, j)
    weights = torch.tensor(taps, device=device).expand(size, -1)
    return torch.zeros(size, size, device=device).scatter_add_(1, j, weights)


def blur_slices16(images: torch.Tensor, sigma: float) -> torch.Tensor:
    return blur_slices(images.half(), sigma).float()


BLURS = {
    "conv": tilewise.blur_exact,
    "slices": blur_slices,
    "slices16": blur_slices16,
    "matmul": blur_matmul,
}


def replay_ms(fn, x, repeats: int) -> float:
    """ms per call of `fn(x)` (after 3 calls: its compile and capture)."""
    cuda = x.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    with torch.inference_mode():
        for _ in range(3):
            fn(x)
        sync()
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn(x)
        sync()
    return (time.perf_counter() - t0) / repeats * 1000


def whole(forward: Forward, batch: int):
    """`forward` on every tile of a batch buffer."""
    return lambda tiles: forward(tiles, batch)


def with_blur(name: str):
    tilewise.blur_exact = BLURS[name]
    torch._dynamo.reset()


def graph(fn):
    """`fn` replayed as a CUDA graph on a GPU (as the engine's --compile does), else as is."""
    return GraphedForward(fn) if torch.cuda.is_available() else fn


def overlapped(loaded, layout: QualityLayout, tables: ColourTables):
    """The model and the measures captured in one graph, the measures on a second stream."""
    model = torch.compile(lambda t: loaded.features(loaded.transform(t)))
    measure = torch.compile(lambda t: layout.measure(t, tables))
    if not torch.cuda.is_available():
        return lambda t: torch.cat([model(t).float(), measure(t)], 1)
    side = torch.cuda.Stream()

    def both(tiles):
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        with torch.autocast(tiles.device.type, dtype=torch.bfloat16):
            out = model(tiles)
        with torch.cuda.stream(side):
            m = measure(tiles)
        main.wait_stream(side)
        return torch.cat([out.float(), m], 1)

    return graph(both)


def kernels(layout: QualityLayout, tables: ColourTables, tiles: torch.Tensor, top: int) -> list:
    from torch.profiler import ProfilerActivity, profile

    if tiles.device.type != "cuda":
        return []
    fn = torch.compile(lambda t: layout.measure(t, tables))
    with torch.inference_mode():
        for _ in range(3):
            fn(tiles)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                fn(tiles)
            torch.cuda.synchronize()
    rows = sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:top]
    return [{"kernel": e.key[:90], "ms_per_batch": round(e.device_time_total / 5 / 1000, 3),
             "calls_per_batch": e.count // 5} for e in rows]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="vit_small_patch16_224")
    parser.add_argument("--blurs", default="conv,slices,slices16,matmul")
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", type=Path, default=Path("quality_cost.json"))
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = False
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # cpu: a smoke test
    tiles = torch.randint(0, 256, (args.batch, 224, 224, 3), dtype=torch.uint8, device=device)
    layout, tables = QualityLayout(0.5, 224), ColourTables.on(device)
    blurs = args.blurs.split(",")
    name = torch.cuda.get_device_name() if device.type == "cuda" else platform.processor()
    result = {"device": name, "torch": torch.__version__,
              "python": platform.python_version(), "batch": args.batch, "models": {},
              "date": time.strftime("%Y-%m-%d")}  # fmt: skip

    print(f"{result['device']}, batch {args.batch}: ms per batch (CUDA graph replays)")
    measures = {}
    for name in blurs:
        with_blur(name)
        t0 = time.perf_counter()
        fn = graph(torch.compile(lambda t: layout.measure(t, tables)))
        graphed = replay_ms(fn, tiles, args.repeats)
        eager = replay_ms(lambda t: layout.measure(t, tables), tiles, 5)
        measures[name] = {"graphed_ms": round(graphed, 3), "eager_ms": round(eager, 3),
                          "compile_s": round(time.perf_counter() - t0, 1)}  # fmt: skip
        print(f"  measures alone, blur {name}: {graphed:.3f} ms graphed, {eager:.3f} eager",
              flush=True)  # fmt: skip
    result["measures"] = measures
    with_blur("conv")
    result["kernels_conv"] = kernels(layout, tables, tiles, 15)
    for row in result["kernels_conv"]:
        print(f"    {row['ms_per_batch']:7.3f} ms  x{row['calls_per_batch']:<3} {row['kernel']}")
    best = min(blurs, key=lambda b: measures[b]["graphed_ms"])
    with_blur(best)
    result[f"kernels_{best}"] = kernels(layout, tables, tiles, 15)
    for row in result[f"kernels_{best}"]:
        print(f"    {row['ms_per_batch']:7.3f} ms  x{row['calls_per_batch']:<3} {row['kernel']}")

    for arch in args.models.split(","):
        loaded = load_model(f"timm:{arch}", device=device)
        loaded.module.to(memory_format=torch.channels_last)
        entry = {}
        with_blur("conv")
        fwd = Forward(loaded, device, "bf16", compile=True)
        entry["model_ms"] = round(replay_ms(whole(fwd, args.batch), tiles, args.repeats), 3)
        print(f"{arch}: model alone {entry['model_ms']:.3f} ms", flush=True)
        for name in blurs:
            with_blur(name)
            fwd = Forward(loaded, device, "bf16", compile=True, quality=layout)
            ms = replay_ms(whole(fwd, args.batch), tiles, args.repeats)
            entry[f"with_{name}_ms"] = round(ms, 3)
            print(f"  + measures ({name}): {ms:.3f} ms ({ms / entry['model_ms']:.3f}x)", flush=True)
        with_blur(best)
        both = overlapped(loaded, layout, tables)
        ms = replay_ms(both, tiles, args.repeats)
        entry[f"overlap_{best}_ms"] = round(ms, 3)
        print(f"  + measures ({best}) on a second stream: {ms:.3f} ms "
              f"({ms / entry['model_ms']:.3f}x)", flush=True)  # fmt: skip
        result["models"][arch] = entry
        torch.cuda.empty_cache()
    with_blur("conv")
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
