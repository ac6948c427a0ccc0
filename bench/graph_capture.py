"""Which tile encoders a run replays as CUDA graphs (issue 68), and what it saves (GPU).

Each registered tile encoder is drawn with random weights (``random:<name>``) on the GPU and
run by `tilestore.embed.forward.Forward` as a run runs it (bf16, the whole batch buffer):
replayed as a CUDA graph, and as it is (eager), on the same real-sized random tiles. The
table says whether the graph was captured (or why not: the model then runs as it is in a
run too), the largest |difference| between the two (0: the same kernels), and the host's
seconds to launch a batch each way (what the GPU loop spends holding, and waiting for, the
GIL) beside the batch's GPU time.

    python bench/graph_capture.py [--models a,b] [--batch 64] [--skip dinov3-vit7b16]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from tilestore.embed.forward import Forward
from tilestore.embed.models import list_models, load_model


def _launch(forward: Forward, tiles: torch.Tensor, repeats: int = 5) -> tuple[float, float]:
    """Median host seconds to launch a batch, and the GPU seconds it takes."""
    hosts, gpus = [], []
    with torch.inference_mode():
        for _ in range(repeats):
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            start.record()
            forward(tiles, len(tiles))
            end.record()
            hosts.append(time.perf_counter() - t0)
            torch.cuda.synchronize()
            gpus.append(start.elapsed_time(end) / 1000)
    return sorted(hosts)[repeats // 2], sorted(gpus)[repeats // 2]


def one(name: str, batch: int) -> dict:
    device = torch.device("cuda")
    loaded = load_model(f"random:{name}", device=device)
    loaded.module.to(memory_format=torch.channels_last)
    side = loaded.transform.input_size
    g = torch.Generator().manual_seed(0)
    tiles = torch.randint(0, 255, (batch, side, side, 3), dtype=torch.uint8, generator=g).to(device)
    graphed = Forward(loaded, device, "bf16", compile=False)
    eager = Forward(loaded, device, "bf16", compile=False, graphs=False)
    with torch.inference_mode():
        first = graphed(tiles, batch).float().clone()  # captured
        replayed = graphed(tiles, batch).float().clone()
        plain = eager(tiles, batch).float().clone()
    host_graph, gpu_graph = _launch(graphed, tiles)
    host_eager, gpu_eager = _launch(eager, tiles)
    row = {
        "model": name,
        "captured": graphed.graph_note is None,
        "note": graphed.graph_note,
        "max_abs_diff": float((replayed - plain).abs().max()),
        "first_vs_eager": float((first - plain).abs().max()),
        "launch_ms_graph": round(1000 * host_graph, 2),
        "launch_ms_eager": round(1000 * host_eager, 2),
        "gpu_ms_graph": round(1000 * gpu_graph, 2),
        "gpu_ms_eager": round(1000 * gpu_eager, 2),
    }
    del graphed, eager, loaded
    torch.cuda.empty_cache()
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="")
    parser.add_argument("--skip", default="dinov3-vit7b16")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--out", default="graph_capture.json")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    names = [m.strip() for m in args.models.split(",") if m.strip()] or [
        spec.name for spec in list_models()
    ]
    rows = []
    print("| model | captured | max abs diff | launch ms graph / eager | GPU ms graph / eager |")
    print("|---|---|---|---|---|")
    for name in names:
        if name in skip:
            continue
        try:
            row = one(name, args.batch)
        except Exception as exc:  # a family this machine cannot build: its row says so
            row = {"model": name, "error": f"{type(exc).__name__}: {str(exc)[:160]}"}
            print(f"| {name} | not built: {row['error']} | | | |", flush=True)
        else:
            said = "yes" if row["captured"] else f"no: {row['note']}"
            print(
                f"| {name} | {said} | {row['max_abs_diff']:.1e} | "
                f"{row['launch_ms_graph']} / {row['launch_ms_eager']} | "
                f"{row['gpu_ms_graph']} / {row['gpu_ms_eager']} |",
                flush=True,
            )
        rows.append(row)
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
