"""Where a cohort of small slides spends the CPUs (issue 68): `--stores` copies of
CMU-1-Small-Region's store (45 tiles each, hard-linked chunks, the plan "bench") embedded by
one warm `Embedder` (timm, random weights), each run on stores never embedded (what a run before
wrote is removed first, untimed: a group replaced costs its removal too); the run's own CPU
a slide (its process time over the run: every thread of the run's process, those holding the
GIL the GPU loop needs and those that do not (torch's, a C library's) alike; a CPU share of
100%: one CPU) and, sampled every 0.5 s, each kind of process's CPU share (the run, its
store processes, its decoder processes) and the machine's, and from them each kind's CPU a
slide (what a small slide costs the machine's CPUs: bench/RESULTS.md, issue 68). Prints one
line a run and writes JSON.

    python bench/run_process.py prep                   # the stores, in --work
    python bench/run_process.py run --tag this         # one run over them
    python bench/run_process.py side                   # one store process's work a store

`side`: what a store process does for each store never embedded, here in one process and
one thread (`tilestore.embed.storeside.Side`: opened, planned and its group made; its rows
written; finished), the first 5 stores aside: the median ms of each step (no GPU needed).

With `--switch S` the run's process sets `sys.setswitchinterval(S)` first (a shorter GIL
turn for the GPU loop; measured, not used: bench/RESULTS.md). `bench/ab.sh` runs it for a
base tree and this one on one machine.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import threading
import time
from pathlib import Path

import psutil
from small_slides import SMALL, embed_run, linked_copies, planned


def prep(work: Path, count: int) -> None:
    import tilestore

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    base = work / "base.ome.zarr"
    tilestore.convert(SMALL, base)
    linked_copies(planned(base), work / "s", count + 3, "s")  # 3 to warm up


class Shares(threading.Thread):
    """Each kind of process's CPU % (the run, and its children by module), every `every` s."""

    def __init__(self, every: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.every, self.rows, self.stop = every, [], threading.Event()
        self.me = psutil.Process()

    def run(self) -> None:
        known: dict[int, psutil.Process] = {}
        self.me.cpu_percent()
        psutil.cpu_percent()
        while not self.stop.wait(self.every):
            row = {"run": self.me.cpu_percent()}
            for child in self.me.children(recursive=True):
                process = known.setdefault(child.pid, child)
                try:
                    share, line = process.cpu_percent(), process.cmdline()
                except psutil.Error:
                    continue
                kind = line[2] if len(line) > 2 and line[1] == "-m" else "other"
                row[kind] = row.get(kind, 0.0) + share
            row["machine"] = psutil.cpu_percent() * psutil.cpu_count() / 100
            self.rows.append(row)

    def means(self) -> dict[str, float]:
        rows = self.rows[2:-2] or self.rows  # the run's start and end aside
        kinds = sorted({k for row in rows for k in row})
        return {k: round(sum(r.get(k, 0.0) for r in rows) / max(1, len(rows))) for k in kinds}


def run(
    work: Path, arch: str, batch: int, tag: str, switch: float | None, compile: bool = False
) -> dict:
    from tilestore.embed import Embedder, Options

    stores = sorted((work / "s").glob("*.ome.zarr"))
    for store in stores:  # every run on stores never embedded, as a new cohort's are
        shutil.rmtree(store / "embeddings", ignore_errors=True)
    options = Options(batch_size=batch, overwrite=True, compile=compile)
    with Embedder(f"random:{arch}", options) as embedder:
        embed_run(embedder, stores[:3])  # the model's first batch, the processes started
        if switch:
            sys.setswitchinterval(switch)
        shares = Shares()
        shares.start()
        cpu = time.process_time()
        result = embed_run(embedder, stores[3:])
        cpu = time.process_time() - cpu
        shares.stop.set()
        shares.join()
    slides = len(stores) - 3
    means = shares.means()
    return {
        "tag": tag,
        "arch": arch,
        "switch_s": switch,
        "compile": compile,
        "run_cpu_ms_a_slide": round(1000 * cpu / slides, 1),
        "cpu_percent": means,
        # each kind of process's CPU a slide: its mean share over the run's wall
        "cpu_ms_a_slide": {
            kind: round(share / 100 * result["wall_s"] * 1000 / slides, 1)
            for kind, share in means.items()
            if kind != "machine"
        },
        **result,
    }


def side(work: Path, arch: str, batch: int) -> dict:
    import os

    import numpy as np

    from tilestore.embed import Embedder, Options
    from tilestore.embed.storeside import Request, Side

    stores = sorted((work / "s").glob("*.ome.zarr"))
    for store in stores:  # on stores never embedded, as `run`'s (untimed)
        shutil.rmtree(store / "embeddings", ignore_errors=True)
    options = Options(batch_size=batch, overwrite=True, device="cpu")
    with Embedder(f"random:{arch}", options) as embedder:
        spec, identity = embedder.loaded.spec, embedder.writer_identity()
    store_side, dim, steps = Side(os.getpid()), identity.model["output_dim"], []
    for key, store in enumerate(stores):
        started = time.perf_counter()
        request = Request(str(store), spec, "bench", identity, True, None, False, False, "bench")
        found = store_side._open(key, request)
        opened = time.perf_counter()
        rows = np.zeros((len(found["todo"]), dim), np.float32)  # one batch: 45 tiles
        store_side._write(key, 0, rows)
        written = time.perf_counter()
        store_side._finish(key, {})
        steps.append((opened - started, written - opened, time.perf_counter() - written))
    ms = 1000 * np.median(np.array(steps[5:]), axis=0)
    return {
        "stores": len(stores) - 5,
        "open_ms": round(float(ms[0]), 1),
        "write_ms": round(float(ms[1]), 1),
        "finish_ms": round(float(ms[2]), 1),
        "all_ms": round(float(ms.sum()), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("step", choices=("prep", "run", "side"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/run_process"))
    parser.add_argument("--stores", type=int, default=400)
    parser.add_argument("--arch", default="vit_small_patch16_224")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--tag", default="this")
    parser.add_argument("--switch", type=float, default=None)
    parser.add_argument(
        "--compile", action="store_true", help="torch.compile the model (replayed as CUDA graphs)"
    )
    parser.add_argument("--out", type=Path, default=None, help="JSON (default: --work/<tag>.json)")
    args = parser.parse_args()
    if args.step == "prep":
        prep(args.work, args.stores)
        return
    if args.step == "side":
        found = side(args.work, args.arch, args.batch_size)
        print(json.dumps(found))
        (args.out or args.work / "side.json").write_text(json.dumps(found, indent=1))
        return
    row = run(args.work, args.arch, args.batch_size, args.tag, args.switch, args.compile)
    fixed = row["per_slide"] or {}
    print(
        f"| {row['tag']} | {row['tiles_per_s']:,.0f} | {row['gpu_busy']} | "
        f"{fixed.get('critical_path_ms', {}).get('median')} | "
        f"{fixed.get('parts_median_ms', {}).get('group')} | {row['run_cpu_ms_a_slide']} | "
        f"{row['cpu_percent']} | {row['cpu_ms_a_slide']} |"
    )
    out = args.out or args.work / f"{args.tag}.json"
    out.write_text(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
