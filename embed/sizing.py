"""Batch sizes: the batch-scaling experiment, the size a run takes, and that choice remembered.

`profile_batches` runs the model on random tiles at each batch size and records tiles/s and
the peak GPU memory of a batch (what the tutorials measure with pynvml and a timer; here
`torch.cuda.max_memory_allocated`). A run's `--batch-size auto` takes the smallest batch
within `WITHIN` of the best tiles/s (less memory, a sooner first batch, the same speed), as
bench/embed.py's search does; out of memory bounds the sizes tried. The choice is kept in
the user's cache (`choice_file`) per model, weights, GPU, precision, input size and torch
version, so a SLURM array's tasks search once, not once each; a memo that is unreadable or
from another of any of these is not used.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from tilestore.caches import user_cache
from tilestore.embed.forward import Forward
from tilestore.embed.models import LoadedModel
from tilestore.embed.settings import (
    BATCHES,
    REPEATS,
    BatchSizes,
    Precision,
    Repeats,
    resolve_device,
)
from tilestore.errors import OptionError
from tilestore.options import checked

WITHIN = 0.03  # batches within 3% of the best tiles/s are equally fast: the smallest wins
# a run's search times each size's batches until about this long (at least 2 batches, at most
# REPEATS): a ViT-L's 1,024-tile batch takes 0.35 s on an H100, so five were 1.75 s of a
# first run's wait for its first batch, where two measure it as well
ENOUGH_S = 0.25


@dataclass(frozen=True)
class BatchRun:
    """One batch size measured: tiles/s and peak GPU memory (MB), None where it did not fit
    (or, for memory, on the CPU)."""

    batch: int
    tiles_per_s: float | None
    peak_mb: float | None


@dataclass(frozen=True)
class Profile:
    """A model's batch-scaling measurement on one device."""

    model: str
    device_name: str
    precision: str
    total_mb: float | None  # the GPU's memory
    model_mb: float | None  # the weights and buffers alone, before any batch
    runs: tuple[BatchRun, ...]

    def choose(self) -> int:
        """The smallest batch within `WITHIN` of the best tiles/s among those that fit."""
        fitted = [r for r in self.runs if r.tiles_per_s]
        if not fitted:
            raise torch.OutOfMemoryError(f"{self.model}: no batch of {BATCHES[0]} fits")
        best = max(r.tiles_per_s for r in fitted)
        return min(r.batch for r in fitted if r.tiles_per_s >= (1 - WITHIN) * best)


@checked
def profile_model(
    name: str,
    batches: BatchSizes = BATCHES,
    *,
    device: str = "auto",
    precision: str = "auto",
    repeats: Repeats = REPEATS,
    token: str | None = None,
) -> Profile:
    """Load a model (a registered name, timm:<arch> or local:<dir>) onto `device` ("auto":
    CUDA where there is one, else the CPU) and measure each batch size (`profile_batches`)
    in `precision` ("auto": bf16 on CUDA, fp32 on the CPU)."""
    from tilestore.embed.forward import place
    from tilestore.embed.models import load_model

    if not batches or min(batches) < 1:
        raise OptionError(f"batches={','.join(map(str, batches))}: sizes of at least 1")
    dev, chosen = resolve_device(device, precision)
    loaded = place(load_model(name, token=token, device=dev), dev)
    return profile_batches(loaded, dev, chosen, batches, repeats)


def profile_batches(
    loaded: LoadedModel,
    device: torch.device,
    precision: Precision,
    batches: tuple[int, ...] = BATCHES,
    repeats: int = REPEATS,
    enough_s: float | None = None,
) -> Profile:
    """Measure each batch size in turn (eager: compiling every size would leave a graph per
    size behind); sizes past the first that runs out of memory are not tried. Each size is
    timed over `repeats` batches, or with enough_s over as many as take about that long (at
    least 2, at most `repeats`), judged by the first of them (the untimed batch before, which
    chooses kernels and grows memory pools, takes several times as long)."""
    forward = Forward(loaded, device, precision, compile=False, graphs=False)  # eager's memory
    cuda = device.type == "cuda"
    size = loaded.transform.resize
    runs: list[BatchRun] = []
    model_mb = torch.cuda.memory_allocated(device) / 2**20 if cuda else None
    for batch in batches:
        tiles = None
        try:
            tiles = torch.randint(0, 255, (batch, size, size, 3), dtype=torch.uint8, device=device)
            forward(tiles, batch)  # untimed: kernels chosen, memory pools grown
            _sync(device)
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
            started = time.perf_counter()
            forward(tiles, batch)
            times = repeats
            if enough_s is not None:  # judged by this timed batch, not the warm-up's
                _sync(device)
                once = max(time.perf_counter() - started, 1e-6)
                times = min(repeats, max(2, math.ceil(enough_s / once)))
            for _ in range(times - 1):
                forward(tiles, batch)
            _sync(device)
            rate = times * batch / (time.perf_counter() - started)
            peak = torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None
            runs.append(BatchRun(batch, rate, peak))
        except torch.OutOfMemoryError:
            runs.append(BatchRun(batch, None, None))
            break
        finally:
            del tiles
            if cuda:
                torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(device).total_memory / 2**20 if cuda else None
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    return Profile(loaded.spec.name, name, precision, total, model_mb, tuple(runs))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def choice_file() -> Path:
    """Where batch choices are remembered, in the user's cache (`user_cache`)."""
    return user_cache() / "batch-sizes.json"


def choice_key(loaded: LoadedModel, device: torch.device, precision: Precision) -> str:
    """What a remembered batch size depends on: model and weights, GPU, precision, input
    size and torch version."""
    described = loaded.describe()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    parts = (
        described["name"],
        str(described.get("revision") or described.get("weights") or ""),
        name,
        precision,
        str(loaded.transform.resize),
        torch.__version__,
    )
    return " | ".join(parts)


def choose_batch(
    loaded: LoadedModel, device: torch.device, precision: Precision, memo: Path | None = None
) -> tuple[int, str]:
    """The batch a run takes and how it was found (for the report): remembered for this
    key, else measured now (`profile_batches`) and remembered."""
    memo = memo or choice_file()
    key = choice_key(loaded, device, precision)
    known = _read(memo)
    if key in known and isinstance(known[key].get("batch"), int):
        entry = known[key]
        return entry["batch"], f"remembered from a search on {entry.get('when', '?')} ({memo})"
    profile = profile_batches(loaded, device, precision, enough_s=ENOUGH_S)
    batch = profile.choose()
    rates = ", ".join(
        f"{r.batch}: {r.tiles_per_s:,.0f}" if r.tiles_per_s else f"{r.batch}: out of memory"
        for r in profile.runs
    )
    known[key] = {
        "batch": batch,
        "when": dt.date.today().isoformat(),
        "runs": [asdict(r) for r in profile.runs],
    }
    _write(memo, known)
    return batch, f"searched (tiles/s per batch: {rates}); smallest within {WITHIN:.0%} of best"


def remembered_rate(
    loaded: LoadedModel, device: torch.device, precision: Precision, memo: Path | None = None
) -> float | None:
    """The model's best tiles/s alone on this GPU, from its batch-size search
    (`choose_batch` remembers every size's rate); None where none was made."""
    entry = _read(memo or choice_file()).get(choice_key(loaded, device, precision), {})
    runs = entry.get("runs", []) if isinstance(entry, dict) else []
    rates = [r.get("tiles_per_s") or 0.0 for r in runs if isinstance(r, dict)]
    return max(rates, default=0.0) or None


def _read(memo: Path) -> dict:
    try:
        known = json.loads(memo.read_text())
    except (OSError, ValueError):  # absent, unreadable or damaged: search again
        return {}
    return known if isinstance(known, dict) else {}


def _write(memo: Path, known: dict) -> None:
    """Replace the memo atomically (tasks of an array may write at once); a cache that
    cannot be written costs only a search next time."""
    with contextlib.suppress(OSError):
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_name(f".{memo.name}.{os.getpid()}")
        tmp.write_text(json.dumps(known, indent=1))
        os.replace(tmp, memo)


def plot_profile(profile: Profile, path: str | os.PathLike) -> None:
    """Tiles/s and peak GPU memory against batch size, side by side, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fitted = [r for r in profile.runs if r.tiles_per_s]
    sizes = [r.batch for r in fitted]
    fig, (speed, memory) = plt.subplots(1, 2, figsize=(10, 3.8))
    speed.plot(sizes, [r.tiles_per_s for r in fitted], "o-")
    speed.set(xscale="log", xlabel="batch size", ylabel="tiles/s", ylim=(0, None))
    speed.set_xticks(sizes, [str(s) for s in sizes])
    speed.axvline(profile.choose(), color="grey", ls=":", label="--batch-size auto")
    speed.legend(loc="lower right")
    if any(r.peak_mb for r in fitted):
        memory.plot(sizes, [r.peak_mb / 1024 for r in fitted], "o-", color="C1")
        if profile.total_mb:
            memory.axhline(profile.total_mb / 1024, color="C3", ls="--", label="GPU memory")
        if profile.model_mb:
            memory.axhline(profile.model_mb / 1024, color="grey", ls=":", label="model alone")
        memory.legend(loc="upper left")
    memory.set(xscale="log", xlabel="batch size", ylabel="peak GPU memory (GiB)", ylim=(0, None))
    memory.set_xticks(sizes, [str(s) for s in sizes])
    fig.suptitle(f"{profile.model} on {profile.device_name}, {profile.precision}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
