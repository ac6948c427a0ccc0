"""Where a slide file's time to its first batch goes: the events of one `embed` run, timed
from the process start, in the order the command meets them (GPU machine or CPU).

As `tilestore embed SLIDE --into DIR` (or `--in-place`) runs it: the Stager made first
(its worker converts while torch is imported), then the model loaded, then the engine
asking for the slide; each step's start and end are printed as it happens, up to the first
batch written, and the process then exits.

    python bench/first_batch.py bench/data/large-100000.svs --model timm:vit_large_patch16_224
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


def timed(owner, name: str) -> None:
    """Print when owner.name starts and returns."""
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        say(f"{name} ...")
        try:
            return inner(*args, **kwargs)
        finally:
            say(f"... {name}")

    setattr(owner, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("slide", type=Path)
    parser.add_argument("--model", default="timm:vit_large_patch16_224")
    parser.add_argument("--in-place", action="store_true")
    parser.add_argument("--work", type=Path, default=Path("/tmp/first-batch"))
    args = parser.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    from tilestore.embed.inputs import Stager

    say("started; making the Stager")
    stager = Stager([args.slide], args.work, None, in_place=args.in_place, sidecars=args.work)
    say("Stager made; importing the engine")
    from tilestore.embed import engine, inputs, jobs, produce
    from tilestore.plan import plans

    say("engine imported")
    timed(inputs.Stager, "_reply")
    timed(jobs, "prepare")
    timed(plans, "plan_slide")
    timed(produce.Producer, "_decode_plan")

    def first(done: int, total: int) -> None:
        say(f"first batch written ({done} of {total} tiles)")
        sys.stdout.flush()
        os._exit(0)

    engine.embed(stager, args.model, progress=first, say=lambda line: say("say:", line))


if __name__ == "__main__":
    main()
