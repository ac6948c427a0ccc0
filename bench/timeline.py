"""Draw a run's timeline as a PNG from `tilestore embed --profile torch`'s trace: one lane per
thread with our stages by name (the ranges `--profile nvtx` gives nsys), and the GPU's
kernels and copies beneath, so where the time goes is seen at a glance.

    python bench/timeline.py tilestore-trace.json timeline.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

STAGES = {  # our range names -> colour
    "wait for tiles": "#bbbbbb",
    "H2D copy": "#1f77b4",
    "forward (preprocess, model)": "#2ca02c",
    "D2H copy": "#17becf",
    "wait for the GPU": "#dddddd",
    "write": "#9467bd",
    "read": "#ff7f0e",
    "decode": "#d62728",
    "read + decode (threads)": "#d62728",
    "read + decode (zarr)": "#d62728",
    "decode (nvJPEG)": "#d62728",
    "cut": "#8c564b",
    "wait for decoded rows": "#cccccc",
    "assemble (cut tiles on the GPU)": "#8c564b",
}
GPU = {"kernel": "#2ca02c", "gpu_memcpy": "#1f77b4"}


def draw(trace: Path, out: Path) -> None:
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]
    ours = [e for e in events if e.get("name") in STAGES]
    gpu = [e for e in events if e.get("cat") in GPU]
    if not ours:
        raise SystemExit(f"{trace}: no tilestore stages in it (run with --profile torch)")
    start = min(e["ts"] for e in ours + gpu)
    lanes: dict[str, list] = {}
    for e in ours:
        lanes.setdefault(f"thread {e['tid']}", []).append(e)
    for e in gpu:
        lanes.setdefault(f"GPU {GPU_NAMES[e['cat']]}", []).append(e)
    names = sorted(lanes, key=lambda n: (n.startswith("GPU"), n))
    fig, ax = plt.subplots(figsize=(14, 0.55 * len(names) + 1.6))
    for row, lane in enumerate(names):
        for e in lanes[lane]:
            color = STAGES.get(e["name"]) or GPU[e["cat"]]
            ax.broken_barh(
                [((e["ts"] - start) / 1e3, e["dur"] / 1e3)],
                (row - 0.4, 0.8),
                color=color,
                linewidth=0,
            )
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    seen = {e["name"] for e in ours}
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for n, c in STAGES.items() if n in seen]
    ax.legend(
        handles,
        [n for n in STAGES if n in seen],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.32),
        ncol=5,
        fontsize=8,
        frameon=False,
    )
    ax.set_title(f"{trace.name}: tilestore stages per thread, GPU work beneath")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


GPU_NAMES = {"kernel": "kernels", "gpu_memcpy": "copies"}

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("trace", type=Path)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    draw(args.trace, args.out)
    print(args.out)
