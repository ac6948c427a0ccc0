"""What the per-tile quality measures cost beside a model on the GPU, and where it goes.

For one batch of 224 px tiles on the GPU, each timed as the engine runs it (compiled and
replayed as one CUDA graph; `tilestore.embed.forward.Forward`):

  model          - the model alone (ViT-S, ViT-B, ...), ms per batch;
  model+measures - the model with the measures in the same graph, for each way of
                   computing the band-pass blur (the measures' largest part):
                     matrices - what tilestore does on a GPU: each Gaussian a banded matrix
                                (edges reflected) on each side of the tile, two fp16
                                matrix products on the tensor cores, fp32 accumulation;
                     conv     - two depthwise convolutions per Gaussian (cuDNN), what it
                                does on a CPU (and did on the GPU before);
  measures       - the measures alone, compiled and graphed, and eager;
  overlap        - the model and the measures in one graph, the measures on a second stream
                   (what running beside the model rather than after it would save);
  kernels        - the compiled measures' CUDA kernels by time (torch.profiler).

    python bench/quality_cost.py --models vit_small_patch16_224,vit_base_patch16_224
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import replace
from pathlib import Path

import torch

from tilestore.embed.forward import Forward, QualityLayout
from tilestore.embed.graphs import GraphedForward
from tilestore.embed.models import load_model
from tilestore.qc.tilewise import TileParams, TileTables, tile_measures


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


def blurred_by(name: str, tables: TileTables) -> TileTables:
    """The tables that make the measures blur by `name` (conv: no matrices)."""
    torch._dynamo.reset()
    return tables if name == "matrices" else replace(tables, gaussians=None)


def graph(fn):
    """`fn` replayed as a CUDA graph on a GPU (as the engine's --compile does), else as is."""
    return GraphedForward(fn) if torch.cuda.is_available() else fn


def overlapped(loaded, layout: QualityLayout, tables: TileTables):
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


def kernels(layout: QualityLayout, tables: TileTables, tiles: torch.Tensor, top: int) -> list:
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
    parser.add_argument("--blurs", default="matrices,conv")
    parser.add_argument("--colour-cells", default="", help="e.g. 2: other colour grids, um")
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", type=Path, default=Path("quality_cost.json"))
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = False
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # cpu: a smoke test
    tiles = torch.randint(0, 256, (args.batch, 224, 224, 3), dtype=torch.uint8, device=device)
    layout = QualityLayout(0.5, 224)
    made = layout.tables(device)
    blurs = args.blurs.split(",")
    name = torch.cuda.get_device_name() if device.type == "cuda" else platform.processor()
    result = {"device": name, "torch": torch.__version__,
              "python": platform.python_version(), "batch": args.batch, "models": {},
              "date": time.strftime("%Y-%m-%d")}  # fmt: skip

    print(f"{result['device']}, batch {args.batch}: ms per batch (CUDA graph replays)")
    measures = {}
    for name in blurs:
        tables = blurred_by(name, made)
        t0 = time.perf_counter()
        fn = graph(torch.compile(lambda t, tables=tables: layout.measure(t, tables)))
        graphed = replay_ms(fn, tiles, args.repeats)
        eager = replay_ms(lambda t, tables=tables: layout.measure(t, tables), tiles, 5)
        measures[name] = {"graphed_ms": round(graphed, 3), "eager_ms": round(eager, 3),
                          "compile_s": round(time.perf_counter() - t0, 1)}  # fmt: skip
        print(f"  measures alone, blur {name}: {graphed:.3f} ms graphed, {eager:.3f} eager",
              flush=True)  # fmt: skip
        result[f"kernels_{name}"] = kernels(layout, tables, tiles, 20)
        for row in result[f"kernels_{name}"]:
            print(
                f"    {row['ms_per_batch']:7.3f} ms  x{row['calls_per_batch']:<3} {row['kernel']}"
            )
    result["measures"] = measures
    for cell in [float(c) for c in args.colour_cells.split(",") if c]:  # other colour grids
        params = TileParams(colour_cell_um=cell)
        tables = blurred_by("matrices", replace(made, params=params))
        fn = graph(torch.compile(lambda t, p=params, tb=tables: tile_measures(t, 0.5, p, tb)))
        ms = replay_ms(fn, tiles, args.repeats)
        result[f"measures_colour_cell_{cell:g}um_ms"] = round(ms, 3)
        print(f"  measures alone, colour cells of {cell:g} um: {ms:.3f} ms graphed", flush=True)

    for arch in [m for m in args.models.split(",") if m]:
        loaded = load_model(f"random:{arch}", device=device)
        loaded.module.to(memory_format=torch.channels_last)
        torch._dynamo.reset()
        fwd = Forward(loaded, device, "bf16", compile=True)
        entry = {"model_ms": round(replay_ms(whole(fwd, args.batch), tiles, args.repeats), 3)}
        print(f"{arch}: model alone {entry['model_ms']:.3f} ms", flush=True)
        for name in blurs:
            fwd = Forward(loaded, device, "bf16", compile=True, quality=layout)
            fwd.tables = blurred_by(name, fwd.tables)  # before its first call compiles it
            ms = replay_ms(whole(fwd, args.batch), tiles, args.repeats)
            entry[f"with_{name}_ms"] = round(ms, 3)
            print(f"  + measures ({name}): {ms:.3f} ms ({ms / entry['model_ms']:.3f}x)", flush=True)
        torch._dynamo.reset()
        ms = replay_ms(overlapped(loaded, layout, made), tiles, args.repeats)
        entry["overlap_ms"] = round(ms, 3)
        print(f"  + measures (matrices) on a second stream: {ms:.3f} ms "
              f"({ms / entry['model_ms']:.3f}x)", flush=True)  # fmt: skip
        result["models"][arch] = entry
        if device.type == "cuda":
            torch.cuda.empty_cache()
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
