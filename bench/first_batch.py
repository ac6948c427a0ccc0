"""Where a slide file's time to its first batch goes: the events of one `embed` run, timed
from the process start, in the order the command meets them (GPU machine or CPU).

As `tilestore embed SLIDE --into DIR` (or `--in-place`) runs it: the Stager made first
(its worker converts while torch is imported), then the model loaded, then the engine
asking for the slide; each step's start and end are printed as it happens, up to the first
batch written, and the process then exits.

    python bench/first_batch.py bench/data/large-100000.svs --model random:vit_large_patch16_224
    python bench/first_batch.py SLIDE --keep    # the store made by a run before: reused

Each hooked step is printed the first times it runs (`--times`): the steps after the
Stager's reply happen once per slide, the producer's row reads many times a slide.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path


def _process_age() -> float:
    """Seconds since this process started, as the run's report counts them (Linux)."""
    with open("/proc/self/stat") as stat:
        started = int(stat.read().rsplit(")", 1)[1].split()[19])
    return time.clock_gettime(time.CLOCK_BOOTTIME) - started / os.sysconf("SC_CLK_TCK")


START = time.perf_counter() - _process_age()


def say(*what) -> None:
    print(f"{time.perf_counter() - START:7.2f} s", *what, flush=True)


def timed(owner, name: str, times: int = 1) -> None:
    """Print when owner.name starts and returns, its first `times` calls."""
    inner = getattr(owner, name)
    calls = [0]

    def wrapper(*args, **kwargs):
        calls[0] += 1
        if calls[0] > times:
            return inner(*args, **kwargs)
        label = f"{name} #{calls[0]}" if times > 1 else name
        say(f"{label} ...")
        try:
            return inner(*args, **kwargs)
        finally:
            say(f"... {label}")

    setattr(owner, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("slide", type=Path)
    parser.add_argument("--model", default="random:vit_large_patch16_224")
    parser.add_argument("--in-place", action="store_true")
    parser.add_argument("--work", type=Path, default=Path("/tmp/first-batch"))
    parser.add_argument("--keep", action="store_true", help="reuse the store or sidecar there")
    parser.add_argument("--times", type=int, default=3, help="row reads printed")
    args = parser.parse_args()
    if not args.keep:
        shutil.rmtree(args.work, ignore_errors=True)
    else:  # the store's features, not the store
        for group in args.work.glob("*/embeddings"):
            shutil.rmtree(group)
    from tilestore.embed.inputs import Stager

    say("started; making the Stager")
    stager = Stager([args.slide], args.work, None, in_place=args.in_place, sidecars=args.work)
    say("Stager made; importing the engine")
    from tilestore.embed import engine, inputs, jobs, produce, rows, runner
    from tilestore.plan import plans

    say("engine imported")
    timed(engine.Embedder, "__init__")
    timed(inputs.Stager, "_reply")
    reply = inputs.Stager._reply

    def told(self, path):
        staged = reply(self, path)
        say(f"the stager's steps, s: {staged.seconds}")
        return staged

    inputs.Stager._reply = told
    timed(jobs, "prepare")
    timed(plans, "plan_over_tissue")
    timed(produce.Producer, "_decode_plan")
    timed(runner.Runner, "_warm_up")
    for source in (rows.ProcessRows, rows.ThreadRows, rows.NvjpegRows):
        timed(source, "_submit", args.times)
        timed(source, "_result", args.times)

    def first(done: int, total: int) -> None:
        say(f"first batch written ({done} of {total} tiles)")
        sys.stdout.flush()
        os._exit(0)

    engine.embed(stager, args.model, progress=first, say=lambda line: say("say:", line))


if __name__ == "__main__":
    main()
