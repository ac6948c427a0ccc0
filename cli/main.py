"""The `tilestore` command: parses, prints, exits. The work happens in tilestore and embed."""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from pathlib import Path
from typing import NoReturn

import typer

from cli.console import as_flags, flags_of, human_size, out, text_table
from cli.console import progress_bar as _progress
from cli.embed import embed, models_app
from cli.export import export_app
from cli.inspect import info, verify
from cli.qc import qc
from tilestore.contrast import ContrastRule
from tilestore.conversion import QUALITY, SUBSAMPLING
from tilestore.errors import TilestoreError
from tilestore.plans import DEFAULT_MPP, DEFAULT_TILE, MIN_TISSUE, PlanOptions
from tilestore.tissue import DEFAULT_MPP as TISSUE_MPP

RULE = ContrastRule()

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Whole-slide images as OME-Zarr stores, tile plans and foundation-model embeddings.",
)


@app.command()
def convert(
    src: list[Path] = typer.Argument(
        ...,
        help="Slide files (SVS, NDPI, OME-TIFF, QPTIFF, TIFF, DICOM, PNG, JPEG) or folders of "
        "DICOM files (one store per series).",
    ),
    output: Path = typer.Option(
        ..., "-o", "--output", help="Directory for <name>.ome.zarr stores."
    ),
    chunk: int | None = typer.Option(
        None, help="Chunk side in px (default: source JPEG tile, else 256)."
    ),
    codec: str = typer.Option(
        "auto", help="auto (JPEG for 8-bit RGB brightfield, else zstd), jpeg, zstd."
    ),
    quality: int = typer.Option(QUALITY, help="JPEG quality when pixels are encoded."),
    subsampling: str = typer.Option(SUBSAMPLING, help="JPEG chroma subsampling when encoding."),
    mpp: float | None = typer.Option(None, help="Level-0 µm/px, overriding the file's value."),
    keep_associated: bool = typer.Option(
        False, help="Also store label/macro images (patient data!)."
    ),
    overwrite: bool = typer.Option(
        False, help="Replace an existing store (only once the new one is complete)."
    ),
    copy: bool = typer.Option(
        True, help="Copy matching JPEG tiles verbatim (--no-copy re-encodes)."
    ),
    workers: int | None = typer.Option(None, help="Threads for reading, decoding and encoding."),
    checksums: bool = typer.Option(
        True, help="End every chunk with its CRC-32C so damage is found when read."
    ),
    lossy_ok: bool = typer.Option(
        False, help="Allow --codec jpeg on pixels that are not 8-bit RGB brightfield."
    ),
    name: str | None = typer.Option(
        None, help="Store name (<name>.ome.zarr) for a single slide, instead of the file's."
    ),
) -> None:
    """Convert slides once into chunked OME-Zarr 0.5 stores."""
    from tilestore.conversion import convert as run_convert

    failed = 0
    slides = [(path, series) for path in src for series in _series_of(path)]
    if name and len(slides) > 1:
        raise TilestoreError(f"--name {name}: names one store, but {len(slides)} slides were given")
    for path, series in slides:
        try:
            with _progress(f"{path.name}") as (progress, task):
                report = run_convert(
                    path,
                    output,
                    series=series,
                    name=name,
                    chunk=chunk,
                    codec=codec,
                    quality=quality,
                    subsampling=subsampling,
                    mpp=mpp,
                    keep_associated=keep_associated,
                    overwrite=overwrite,
                    copy=copy,
                    workers=workers,
                    checksums=checksums,
                    lossy_ok=lossy_ok,
                    progress=lambda n, total: progress.update(task, advance=n, total=total),
                )
        except TilestoreError as exc:
            _error(exc)
            failed += 1
            continue
        out.print(
            f"[bold]{report.store}[/bold]  codec {report.codec} ({report.codec_reason}), "
            f"chunks {report.chunk} px",
            highlight=False,
        )
        table = text_table("level", "w x h", "scale", "path", "why", "chunks", "s")
        for lv in report.levels:
            table.add_row(
                lv.path,
                f"{lv.shape[2]}x{lv.shape[1]}",
                f"1/{lv.downsample[1]:.3g}",
                lv.write,
                lv.reason,
                str(lv.chunks),
                f"{lv.seconds:.2f}",
            )
        out.print(table)
        out.print(
            f"{human_size(report.source_bytes)} -> {human_size(report.store_bytes)} "
            f"({report.store_bytes / report.source_bytes:.2f}x) in {report.seconds:.1f} s"
        )
    if failed:
        raise typer.Exit(2)


def _series_of(path: Path) -> list[str | None]:
    """A folder of several DICOM series is one slide per series; anything else is one slide."""
    if not path.is_dir():
        return [None]
    from tilestore.sources import dicom_series

    try:
        found = dicom_series(path)
    except TilestoreError:
        return [None]  # open_source says what is wrong with it
    return list(found) if len(found) > 1 else [None]


@app.command()
def tissue(
    store: Path = typer.Argument(..., help="A store made by `tilestore convert`."),
    method: str = typer.Option(
        "auto", help="auto (detects brightfield/fluorescence), otsu, contrast."
    ),
    mpp: float = typer.Option(
        TISSUE_MPP, help="Mask resolution, um/px (read from a low-resolution level)."
    ),
    preview: Path | None = typer.Option(None, help="Also write a PNG of the mask over the slide."),
    channel: str | None = typer.Option(
        None, help="Fluorescence: the nuclear channel, by name or index (default: DAPI/Hoechst)."
    ),
) -> None:
    """Compute the tissue mask and store it as the OME-Zarr label image labels/tissue."""
    from tilestore.preview import save_preview
    from tilestore.slide import open_slide
    from tilestore.tissue import compute_tissue, write_tissue

    slide = open_slide(store)
    mask = compute_tissue(slide, method, mpp, **({"channel": channel} if channel else {}))
    write_tissue(slide, mask)
    for note in mask.notes:
        out.print(f"  {note}", highlight=False)
    h, w = mask.mask.shape
    if mask.mask.any():
        out.print(
            f"{store}: tissue covers {mask.fraction:.1%} ({mask.method}, {mask.polarity}; "
            f"mask {w}x{h} px) -> labels/tissue",
            highlight=False,
        )
    else:
        out.print(
            f"{store}: no tissue found ({mask.method}, {mask.polarity}); an empty mask is "
            "stored and plans will keep no tiles",
            highlight=False,
        )
    if preview:
        save_preview(preview, slide, tissue=mask)
        out.print(f"preview: {preview}")


@app.command()
def plan(
    store: Path = typer.Argument(..., help="A store made by `tilestore convert`."),
    mpp: float = typer.Option(
        DEFAULT_MPP, help="Tile resolution, um/px (0: level-0 pixels, for slides without mpp)."
    ),
    tile: int = typer.Option(DEFAULT_TILE, help="Tile side in pixels at --mpp."),
    stride: int | None = typer.Option(
        PlanOptions.stride, help="Pixels between tile starts (default: --tile)."
    ),
    min_tissue: float | None = typer.Option(
        PlanOptions.min_tissue,
        help=f"Keep tiles with at least this tissue fraction (default {MIN_TISSUE}; 0 "
        "with --filter).",
    ),
    roi: Path | None = typer.Option(
        PlanOptions.roi, help="ROI annotations: QuPath GeoJSON, Aperio or ASAP XML."
    ),
    roi_class: str | None = typer.Option(
        PlanOptions.roi_class, help="Use only ROIs of this class."
    ),
    min_roi: float = typer.Option(
        PlanOptions.min_roi, help="Keep tiles with at least this ROI overlap."
    ),
    roi_mpp: float | None = typer.Option(
        PlanOptions.roi_mpp, help="um/px the ROI coordinates were drawn at."
    ),
    tolerance: float = typer.Option(
        PlanOptions.tolerance, help="Use a level as is if its mpp is this close."
    ),
    name: str | None = typer.Option(
        PlanOptions.name, help="Plan name (default: e.g. 0.5mpp-224px)."
    ),
    max_artefact: float | None = typer.Option(
        PlanOptions.max_artefact,
        help="Drop tiles more than this share artefact (needs `tilestore qc` first).",
    ),
    exclude: str | None = typer.Option(
        None, help="The artefacts --max-artefact counts, comma-separated (default: all)."
    ),
    filter: str | None = typer.Option(
        PlanOptions.filter, help="contrast: keep tiles whose own pixels pass the tutorial rule."
    ),
    contrast_min: int = typer.Option(RULE.max_min, help="--filter contrast: min below this."),
    contrast_max: int = typer.Option(RULE.min_max, help="--filter contrast: max at least this."),
    contrast_p5: int = typer.Option(RULE.max_p5, help="--filter contrast: p5 below this."),
    contrast_median: int = typer.Option(
        RULE.max_median, help="--filter contrast: median below this."
    ),
    overwrite: bool = typer.Option(False, help="Replace a plan of the same name."),
    preview: Path | None = typer.Option(None, help="Write a PNG: thumbnail, tissue, ROIs, tiles."),
) -> None:
    """Plan the tiles to embed and store the plan in the slide's store."""
    from tilestore.annotations import load_annotations
    from tilestore.plans import plan_slide, save_plan
    from tilestore.preview import save_preview
    from tilestore.slide import open_slide
    from tilestore.tissue import read_tissue

    slide = open_slide(store)
    options = PlanOptions(
        mpp=mpp,
        tile=tile,
        stride=stride,
        min_tissue=min_tissue,
        roi=roi,
        roi_class=roi_class,
        min_roi=min_roi,
        roi_mpp=roi_mpp,
        tolerance=tolerance,
        name=name,
        max_artefact=max_artefact,
        exclude=tuple(e.strip() for e in exclude.split(",")) if exclude else None,
        filter=filter,
        contrast=ContrastRule(contrast_min, contrast_max, contrast_p5, contrast_median),
    )
    made = plan_slide(slide, options)
    save_plan(slide, made, overwrite=overwrite)
    for note in made.notes:
        out.print(f"  {note}", highlight=False)
    rows, cols = made.spec.grid
    out.print(
        f"{store}: plan {made.name!r}: {len(made)} of {rows * cols} tiles, "
        f"{len(made.needed_chunks())} chunks of level {made.spec.level} "
        f"(effective {made.spec.effective_mpp or 0:.4g} um/px)",
        highlight=False,
    )
    if preview:
        _, h0, w0 = slide.shape
        rois = load_annotations(roi, size=(w0, h0)).select(roi_class) if roi else None
        save_preview(preview, slide, tissue=read_tissue(slide), rois=rois, plan=made)
        out.print(f"preview: {preview}")


app.command()(embed)
app.command()(info)
app.command()(verify)
app.command()(qc)
app.add_typer(models_app, name="models")
app.add_typer(export_app, name="export")


def _flags() -> dict:
    """Every command's flags by parameter name, to put library messages in their terms."""
    callbacks = [c.callback for c in app.registered_commands]
    for group in app.registered_groups:
        callbacks += [c.callback for c in group.typer_instance.registered_commands]
    return flags_of(*callbacks)


def _error(exc: BaseException) -> None:
    message = as_flags(" ".join(str(exc).split()), _flags())
    print(f"tilestore: error: {message}", file=sys.stderr)


def _warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"tilestore: warning: {as_flags(str(message), _flags())}", file=sys.stderr)


@app.callback()
def _options(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks (for bug reports)."),
) -> None:
    """Whole-slide images as OME-Zarr stores, tile plans and foundation-model embeddings."""


def main() -> None:
    """Console entry point: every failure is one line on stderr and exit code 2; a
    traceback only with --debug. A command that ends (well or with its error) ends the
    process at once (`_leave`)."""
    try:
        _main()
    except SystemExit as done:
        _leave(done.code)


def _leave(code: int | str | None) -> NoReturn:
    """End the process now, as `sys.exit(code)` would, less Python's teardown. The command
    has finished: its files are written and closed, its worker processes stopped. The
    teardown after it (finalising every module torch loads, its exit handlers, the CUDA
    context) took 1.3-1.4 s of an 8-9 s `tilestore embed` on an H100 (bench/RESULTS.md,
    "Exit"); the OS reclaims the same things at once."""
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError):  # a reader gone (`| head`): nothing to say to it
            stream.flush()
    os._exit(code)


def _main() -> None:
    warnings.showwarning = _warning
    debug = "--debug" in sys.argv[1:]
    try:
        app()
    except TilestoreError as exc:
        if debug:
            raise
        _error(exc)
        sys.exit(2)
    except KeyboardInterrupt:
        print("tilestore: interrupted", file=sys.stderr)
        sys.exit(130)
    except OSError as exc:  # the machine's refusal: a full disk, a permission
        if debug:
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        _error(f"{where}{exc.strerror or exc}")
        sys.exit(2)
    except Exception as exc:  # a bug of ours: one line, and where to see more
        if debug:
            raise
        _error(
            f"internal error ({type(exc).__name__}: {exc}); rerun with --debug for the "
            "traceback and report it"
        )
        sys.exit(2)
