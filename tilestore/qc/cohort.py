"""QC of many stores: one task per slide, here or on a Dask cluster, each returning the
row the cohort report is made of (the summary plus a thumbnail and its overlay)."""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from tilestore.errors import NotJudged, TilestoreError
from tilestore.options import checked
from tilestore.qc.maps import QCMaps, compute_qc
from tilestore.qc.options import FlagFraction, QCOptions
from tilestore.qc.store import FLAG_FRACTION, write_qc

THUMB = 320  # px, longer side of the report's pictures


@dataclass
class SlideQC:
    """One slide's result: its summary and pictures, or why it failed."""

    store: str
    name: str
    summary: dict[str, Any] | None = None
    thumbnail: bytes = b""  # JPEG
    overlay: bytes = b""  # JPEG: the artefacts painted over the thumbnail
    error: str | None = None
    not_judged: str | None = None  # why QC does not judge this slide (fluorescence...)
    notes: list[str] = field(default_factory=list)


def qc_store(
    store: str | os.PathLike,
    options: QCOptions | None = None,
    *,
    flag_fraction: float = FLAG_FRACTION,
    preview: str | os.PathLike | None = None,
    threads: int | None = None,
) -> SlideQC:
    """QC one store and store the result in it; a failure is returned, not raised, so one
    damaged slide does not stop a cohort. preview: a folder for <name>.qc.png."""
    from tilestore.reading.opening import open_slide

    options = options or QCOptions()
    name = Path(store).name.removesuffix(".ome.zarr").removesuffix(".zarr")
    try:
        slide = open_slide(store)
        maps = compute_qc(slide, replace(options, threads=threads or options.threads))
        summary = write_qc(slide, maps, flag_fraction)
        image, overlay = pictures(slide, maps)
    except NotJudged as exc:
        return SlideQC(str(store), name, not_judged=str(exc))
    except TilestoreError as exc:
        return SlideQC(str(store), name, error=str(exc))
    if preview is not None:
        Path(preview).mkdir(parents=True, exist_ok=True)
        _, big = pictures(slide, maps, size=1600)
        with_legend(big, maps).save(Path(preview) / f"{name}.qc.png")
    return SlideQC(
        str(store),
        name,
        summary,
        _jpeg(image),
        _jpeg(overlay),
        notes=maps.notes,
    )


def pictures(slide, maps: QCMaps, size: int = THUMB):
    """(thumbnail, thumbnail with artefact colours over it) as PIL images."""
    from PIL import Image

    from tilestore.analysis.preview import thumbnail
    from tilestore.qc.classes import ARTEFACTS

    pixels, _ = thumbnail(slide, size)
    image = Image.fromarray(pixels)
    h, w = pixels.shape[:2]
    label = maps.label()
    iy = np.minimum((np.arange(h) + 0.5) * label.shape[0] / h, label.shape[0] - 1).astype(int)
    ix = np.minimum((np.arange(w) + 0.5) * label.shape[1] / w, label.shape[1] - 1).astype(int)
    small = label[iy][:, ix]
    colours = np.zeros((len(maps.classes) + 1, 4), np.float32)
    for k, name in enumerate(maps.classes, start=1):
        colours[k] = ARTEFACTS[name].rgba
    rgba = colours[small]
    alpha = rgba[..., 3:] / 255
    painted = pixels * (1 - alpha) + rgba[..., :3] * alpha
    return image, Image.fromarray(painted.astype(np.uint8))


def with_legend(image, maps: QCMaps):
    """The picture with a legend strip below it: each artefact's colour, name and share of
    the tissue (the ones QC looked for; those it could not judge say so)."""
    from PIL import Image, ImageDraw

    from tilestore.qc.classes import ARTEFACTS

    entries = [(n, ARTEFACTS[n].rgba[:3], f"{n} {_share(maps, n)}") for n in maps.classes]
    entries += [(n, (200, 200, 200), f"{n}: not judged") for n in maps.not_judged]
    row, pad = 22, 6
    per_line = max(1, image.width // 190)
    lines = -(-len(entries) // per_line) if entries else 0
    out = Image.new(
        "RGB", (image.width, image.height + lines * row + (pad if lines else 0)), "white"
    )
    out.paste(image, (0, 0))
    draw = ImageDraw.Draw(out)
    for i, (_, colour, text) in enumerate(entries):
        x = pad + (i % per_line) * 190
        y = image.height + pad + (i // per_line) * row
        draw.rectangle((x, y, x + 14, y + 14), fill=colour, outline=(80, 80, 80))
        draw.text((x + 20, y + 1), text, fill=(20, 20, 20))
    return out


def _share(maps: QCMaps, name: str) -> str:
    tissue = maps.tissue.sum()
    return f"{(maps.mask(name) & maps.tissue).sum() / tissue:.1%}" if tissue else "-"


def _jpeg(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=85)
    return buffer.getvalue()


@checked
def qc_cohort(
    stores: Sequence[str | os.PathLike],
    options: QCOptions | None = None,
    *,
    flag_fraction: FlagFraction = FLAG_FRACTION,
    preview: str | os.PathLike | None = None,
    client=None,
    threads: int | None = None,
    progress: Callable[[SlideQC], None] | None = None,
) -> tuple[list[SlideQC], float]:
    """(every store's result in the order given, wall seconds). With a Dask `client`
    the slides run in parallel on its workers (each with `threads` torch threads)."""
    options = options or QCOptions()
    start = time.perf_counter()
    kwargs = {"flag_fraction": flag_fraction, "preview": preview, "threads": threads}
    results: list[SlideQC] = []
    if client is None:
        for store in stores:
            results.append(qc_store(store, options, **kwargs))
            if progress:
                progress(results[-1])
        return results, time.perf_counter() - start
    from distributed import as_completed

    futures = [
        client.submit(qc_store, str(s), options, **kwargs, key=f"qc-{i}-{Path(s).name}")
        for i, s in enumerate(stores)
    ]
    order = {f.key: i for i, f in enumerate(futures)}
    done: dict[int, SlideQC] = {}
    for future in as_completed(futures):
        done[order[future.key]] = future.result()
        if progress:
            progress(done[order[future.key]])
    return [done[i] for i in range(len(futures))], time.perf_counter() - start
