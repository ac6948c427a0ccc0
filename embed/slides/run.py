"""Slide embeddings of stores: each store's stored tile features (no pixels read again)
through one slide encoder, the vector written back beside them."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from tilestore.embed.settings import Device, resolve_device
from tilestore.embed.slides.load import LoadedSlideEncoder, load_slide_encoder
from tilestore.embed.slides.registry import get_slide_encoder, tile_model_for
from tilestore.embed.slides.spec import SlidePrecision, SlideSpec
from tilestore.embeddings.groups import plan_groups
from tilestore.embeddings.slides import (
    SlideEmbeddingExists,
    TileFeatures,
    has_current_vector,
    read_tile_features,
    write_slide_vector,
)
from tilestore.errors import NotEmbedded, SlideEncoderError, TilestoreError
from tilestore.options import checked


@dataclass
class SlideRow:
    """One store: done (with its seconds and peak GPU memory), skipped or failed (why)."""

    store: str
    status: str
    tiles: int = 0
    seconds: float | None = None
    peak_gpu_mb: float | None = None
    why: str = ""
    path: str = ""  # where the vector was written in the store


@dataclass
class SlideReport:
    encoder: str
    model: str
    device: str
    precision: str
    weights: str = ""
    rows: list[SlideRow] = field(default_factory=list)

    @property
    def failures(self) -> list[SlideRow]:
        return [r for r in self.rows if r.status == "failed"]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        """The report as the command prints it: a line per store, failures as errors."""
        out = []
        for row in self.rows:
            if row.status == "done":
                memory = f", peak GPU {row.peak_gpu_mb:,.0f} MB" if row.peak_gpu_mb else ""
                out.append(
                    f"{row.store}: {self.encoder} from {row.tiles:,} {self.model} tiles in "
                    f"{row.seconds:.2f} s{memory} -> {row.path}"
                )
            elif row.status == "skipped":
                out.append(f"{row.store}: skipped ({row.why})")
            else:
                out.append(f"tilestore: error: {row.why}")
        return out


@checked
def embed_slides(
    stores: Sequence[str | os.PathLike],
    encoder: str,
    *,
    model: str | None = None,
    device: Device = "auto",
    precision: SlidePrecision = "auto",
    overwrite: bool = False,
    token: str | None = None,
    weights: str | os.PathLike | None = None,
    progress: Callable[[int, int], None] | None = None,
    plan: str | None = None,
) -> SlideReport:
    """Compute and store each store's slide embedding with `encoder` from its stored tile
    features of the encoder's tile model (`model` for the pooling encoders), of `plan`
    (None: the model's only plan's in each store).

    A store whose tile features are not what the encoder reads (model, um/px, tile size,
    grid) is refused with one line, as is one without them; a store with this embedding
    already is skipped unless overwrite. precision "auto": the authors' (fp16, bf16) on CUDA,
    fp32 on the CPU. The encoder is loaded once, at the first store that needs it."""
    spec = get_slide_encoder(encoder)
    tile_model = tile_model_for(spec, model)
    dev, _ = resolve_device(device, "fp32")
    run_precision = precision_for(spec, precision, dev)
    report = SlideReport(spec.name, tile_model, str(dev), run_precision)
    loaded: LoadedSlideEncoder | None = None
    for store in stores:
        try:
            chosen = plan if plan is not None else _plan_read(store, tile_model, spec)
            if not overwrite and has_current_vector(store, tile_model, spec.name, chosen):
                report.rows.append(SlideRow(str(store), "skipped", why="done already"))
                continue
            tiles = read_tile_features(store, tile_model, chosen)
            why = spec.refusal(tiles)
            if why:
                raise SlideEncoderError(why)
            guide = _guide(store, spec, tiles)
            if loaded is None:
                loaded = load_slide_encoder(
                    spec, in_dim=tiles.features.shape[1], token=token, weights=weights, device=dev
                )
                report.weights = loaded.weights
            elif loaded.in_dim is not None and loaded.in_dim != tiles.features.shape[1]:
                raise SlideEncoderError(
                    f"{tiles.name}: {tiles.features.shape[1]}-d tile features; this run's "
                    f"{spec.name} took {loaded.in_dim}-d ones"
                )
            row = _encode(loaded, tiles, dev, run_precision, overwrite=True, guide=guide)
            report.rows.append(row)
        except SlideEmbeddingExists as exc:
            report.rows.append(SlideRow(str(store), "skipped", why=str(exc)))
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            report.rows.append(
                SlideRow(str(store), "failed", why=f"{store}: {spec.name} ran out of GPU memory")
            )
        except (TilestoreError, OSError) as exc:
            report.rows.append(SlideRow(str(store), "failed", why=str(exc)))
        if progress:
            progress(1, len(stores))
    return report


def _plan_read(store, tile_model: str, spec: SlideSpec) -> str | None:
    """The plan whose tile features the encoder reads where none is named: the model's only
    plan's group (None: `read_tile_features` finds it or says why); of several, the one
    finished group whose tiles the encoder reads (`SlideSpec.refusal`), else an error
    naming them."""
    groups = plan_groups(store, tile_model)
    if len(groups) < 2:
        return None
    fits = []
    for name in sorted(groups):
        try:
            tiles = read_tile_features(store, tile_model, name)
        except TilestoreError:
            continue
        if spec.refusal(tiles) is None:
            fits.append(name)
    if len(fits) == 1:
        return fits[0]
    raise SlideEncoderError(
        f"{store}: {tile_model!r} embeddings of {len(groups)} plans ({', '.join(sorted(groups))})"
        f", {len(fits)} of them tiles {spec.name} reads; name the plan (plan=<name>, --plan)"
    )


def _guide(store, spec: SlideSpec, tiles: TileFeatures) -> TileFeatures | None:
    """The spec's guide model's features of `tiles`' own plan (None where it names none);
    SlideEncoderError in one line where they are not there or not of the same tiles."""
    if spec.guide is None:
        return None
    try:
        guide = read_tile_features(store, spec.guide, tiles.plan)
    except NotEmbedded as exc:
        raise SlideEncoderError(
            f"{tiles.name}: {spec.name} is guided by {spec.guide} features of the same tiles "
            f"(plan {tiles.plan}): {exc}; embed with --model {spec.guide} --plan {tiles.plan} "
            "--any-scale"
        ) from None
    why = spec.guide_refusal(tiles, guide)
    if why:
        raise SlideEncoderError(why)
    return guide


def _encode(
    loaded: LoadedSlideEncoder,
    tiles,
    device,
    precision: str,
    overwrite: bool,
    guide: TileFeatures | None = None,
) -> SlideRow:
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    vector = loaded.encode(tiles, device, precision, guide)
    if cuda:
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None
    record = loaded.describe(precision)
    if guide is not None:  # the features that chose: a vector of replaced ones is stale
        record["guide"] = guide.source()
    path = write_slide_vector(tiles, loaded.spec.name, vector, record, overwrite=overwrite)
    return SlideRow(tiles.store, "done", tiles.tiles, round(seconds, 4), peak, path=path)


def precision_for(spec: SlideSpec, option: str, device: torch.device) -> str:
    """The precision a run computes in: "auto" is the authors' on CUDA, fp32 on the CPU."""
    if option == "auto":
        return spec.precision if device.type == "cuda" else "fp32"
    return option
