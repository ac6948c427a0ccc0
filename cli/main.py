"""The `tilestore` command: parses, prints, exits. The work happens in tilestore and embed."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from cli.export import export_app
from tilestore.errors import TilestoreError

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Whole-slide images as OME-Zarr stores, tile plans and foundation-model embeddings.",
)
out = Console()
err = Console(stderr=True)


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TB"


@app.command()
def convert(
    src: list[Path] = typer.Argument(
        ..., help="Slide files (SVS, NDPI, OME-TIFF, TIFF, PNG, JPEG)."
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
    quality: int = typer.Option(95, help="JPEG quality when pixels are encoded."),
    subsampling: str = typer.Option("4:4:4", help="JPEG chroma subsampling when encoding."),
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
) -> None:
    """Convert slides once into chunked OME-Zarr 0.5 stores."""
    from tilestore.conversion import convert as run_convert

    failed = 0
    for path in src:
        try:
            with _progress(f"{path.name}") as (progress, task):
                report = run_convert(
                    path,
                    output,
                    chunk=chunk,
                    codec=codec,
                    quality=quality,
                    subsampling=subsampling,
                    mpp=mpp,
                    keep_associated=keep_associated,
                    overwrite=overwrite,
                    copy=copy,
                    workers=workers,
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
        table = Table(box=None, pad_edge=False)
        for col in ("level", "w x h", "scale", "path", "why", "chunks", "s"):
            table.add_column(col, overflow="fold")
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
            f"{_size(report.source_bytes)} -> {_size(report.store_bytes)} "
            f"({report.store_bytes / report.source_bytes:.2f}x) in {report.seconds:.1f} s"
        )
    if failed:
        raise typer.Exit(2)


@app.command()
def info(
    path: Path = typer.Argument(..., help="A store (.ome.zarr) or a slide file."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Describe a store or a slide: levels, mpp, chunking, codec, size, completeness."""
    from tilestore.info import describe

    desc = describe(path)
    if as_json:
        print(json.dumps(desc, indent=2))
        return
    mpp = desc["mpp"]
    mpp_text = (
        "unknown"
        if not mpp
        else (
            f"{mpp['x']:.4g} x {mpp['y']:.4g} µm/px ({mpp['origin']})"
            if "x" in mpp
            else f"{mpp['value'][0]:.4g} x {mpp['value'][1]:.4g} µm/px ({mpp['origin']})"
        )
    )
    out.print(f"[bold]{desc['path']}[/bold]  {desc['kind']}", highlight=False)
    out.print(f"mpp: {mpp_text}", highlight=False)
    if desc["kind"] == "store":
        state = "complete" if desc["complete"] else "[red]INCOMPLETE (interrupted)[/red]"
        out.print(
            f"state: {state}; source {desc['source']['name']} ({desc['source']['format']}); "
            f"size {_size(desc['size_bytes'])} = {desc['size_vs_source']}x source; "
            f"codec {desc['codec']['name']} ({desc['codec']['reason']})",
            highlight=False,
        )
        table = Table(box=None, pad_edge=False)
        for col in ("level", "shape c,y,x", "chunk", "scale", "µm/px", "codecs", "path"):
            table.add_column(col, overflow="fold")
        for lv in desc["levels"]:
            table.add_row(
                lv["path"],
                "x".join(map(str, lv["shape"])),
                "x".join(map(str, lv["chunks"][1:])),
                f"1/{lv['downsample'][1]:.3g}",
                f"{lv['mpp'][0]:.4g}" if lv["mpp"] else "-",
                "+".join(lv["codecs"]),
                lv["write"],
            )
        if desc["tissue"]:
            out.print(
                f"tissue: {desc['tissue']['fraction']:.1%} ({desc['tissue']['method']}, "
                f"{desc['tissue']['polarity']})",
                highlight=False,
            )
        for name, tiles in desc["plans"].items():
            out.print(f"plan {name}: {tiles} tiles", highlight=False)
    else:
        out.print(
            f"format {desc['format']} ({desc['vendor'] or 'generic'}); "
            f"size {_size(desc['size_bytes'])}; associated: "
            f"{', '.join(desc['associated']) or 'none'}",
            highlight=False,
        )
        table = Table(box=None, pad_edge=False)
        for col in ("level", "shape c,y,x", "dtype", "compression", "tile", "copyable"):
            table.add_column(col, overflow="fold")
        for i, lv in enumerate(desc["levels"]):
            table.add_row(
                str(i),
                "x".join(map(str, lv["shape"])),
                lv["dtype"],
                lv["compression"],
                "x".join(map(str, lv["tile"])) if lv["tile"] else "strips",
                "yes" if lv["copyable"] else f"no: {lv['why_not']}",
            )
    out.print(table)


@app.command()
def tissue(
    store: Path = typer.Argument(..., help="A store made by `tilestore convert`."),
    method: str = typer.Option(
        "auto", help="auto (detects brightfield/fluorescence), otsu, contrast."
    ),
    mpp: float = typer.Option(
        8.0, help="Mask resolution, um/px (read from a low-resolution level)."
    ),
    preview: Path | None = typer.Option(None, help="Also write a PNG of the mask over the slide."),
) -> None:
    """Compute the tissue mask and store it as the OME-Zarr label image labels/tissue."""
    from tilestore.preview import save_preview
    from tilestore.slide import open_slide
    from tilestore.tissue import compute_tissue, write_tissue

    slide = open_slide(store)
    mask = compute_tissue(slide, method, mpp)
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
        0.5, help="Tile resolution, um/px (0: level-0 pixels, for slides without mpp)."
    ),
    tile: int = typer.Option(224, help="Tile side in pixels at --mpp."),
    stride: int | None = typer.Option(None, help="Pixels between tile starts (default: --tile)."),
    min_tissue: float = typer.Option(0.5, help="Keep tiles with at least this tissue fraction."),
    roi: Path | None = typer.Option(
        None, help="ROI annotations: QuPath GeoJSON, Aperio or ASAP XML."
    ),
    roi_class: str | None = typer.Option(None, help="Use only ROIs of this class."),
    min_roi: float = typer.Option(0.5, help="Keep tiles with at least this ROI overlap."),
    roi_mpp: float | None = typer.Option(None, help="um/px the ROI coordinates were drawn at."),
    tolerance: float = typer.Option(0.02, help="Use a level as is if its mpp is this close."),
    name: str | None = typer.Option(None, help="Plan name (default: e.g. 0.5mpp-224px)."),
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
    made = plan_slide(
        slide,
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
    )
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


@app.command()
def embed(
    stores: list[Path] = typer.Argument(..., help="Stores to embed (one model load for all)."),
    model: str = typer.Option(
        ..., help="Model name (see `tilestore models list`), timm:<arch> or local:<dir>."
    ),
    plan: str | None = typer.Option(
        None, help="A stored plan (default: the store's only plan, else a new one)."
    ),
    mpp: float | None = typer.Option(
        None, help="Plan option: tile mpp (default: the model's native mpp)."
    ),
    tile: int | None = typer.Option(None, help="Plan option: tile px (default: the model's)."),
    stride: int | None = typer.Option(None, help="Plan option: px between tiles."),
    min_tissue: float | None = typer.Option(None, help="Plan option: minimum tissue fraction."),
    roi: Path | None = typer.Option(None, help="Plan option: ROI annotations file."),
    roi_class: str | None = typer.Option(None, help="Plan option: ROI class to keep."),
    min_roi: float | None = typer.Option(None, help="Plan option: minimum ROI overlap."),
    batch_size: str = typer.Option(
        "auto", help="Tiles per batch, or auto (largest that fits and helps)."
    ),
    device: str = typer.Option("auto", help="auto, cuda, cuda:N or cpu."),
    decode: str = typer.Option(
        "auto", help="JPEG decoding: auto (GPU with CUDA), cpu, gpu (nvJPEG)."
    ),
    precision: str = typer.Option("auto", help="auto (bf16 on CUDA, fp32 on CPU), bf16, fp32."),
    dtype: str = typer.Option("float16", help="Stored features: float16 or float32."),
    compile: bool = typer.Option(
        False, "--compile", help="torch.compile the model (slow start, faster run)."
    ),
    readers: int = typer.Option(4, help="Threads reading chunk rows ahead."),
    decoders: int | None = typer.Option(
        None, help="CPU JPEG decoders: threads, or worker processes on CUDA (default: cores - 2)."
    ),
    report: Path | None = typer.Option(None, help="Write the run report as JSON here."),
    overwrite: bool = typer.Option(False, help="Recompute embeddings this model already made."),
    hf_token: str | None = typer.Option(
        None, help="Hugging Face token (default: HF_TOKEN or the stored login).", envvar=None
    ),
) -> None:
    """Embed plan tiles with a foundation model; write embeddings/<model> into each store."""
    from embed.engine import Options
    from embed.engine import embed as run_embed
    from embed.report import format_report

    plan_options = {
        k: v
        for k, v in {
            "mpp": mpp,
            "tile": tile,
            "stride": stride,
            "min_tissue": min_tissue,
            "roi": roi,
            "roi_class": roi_class,
            "min_roi": min_roi,
        }.items()
        if v is not None
    }
    if plan and plan_options:
        raise TilestoreError("--plan names a stored plan: plan options cannot change it")
    if batch_size != "auto" and not batch_size.isdigit():
        raise TilestoreError(f"--batch-size {batch_size}: a number or auto")
    defaults = Options()
    options = Options(
        batch_size=None if batch_size == "auto" else int(batch_size),
        device=device,
        decode=decode,
        precision=precision,
        dtype=dtype,
        compile=compile,
        readers=readers,
        decoders=decoders or defaults.decoders,
        overwrite=overwrite,
        hf_token=hf_token,
    )
    with _progress(f"embedding with {model}") as (progress, task):
        result = run_embed(
            stores,
            model,
            plan=plan,
            plan_options=plan_options,
            options=options,
            report_path=report,
            progress=lambda n, total: progress.update(task, advance=n, total=total),
        )
    for line in format_report(result):  # plain print: never wrap a line
        print(line, file=sys.stderr if line.startswith(("WARNING", "  FAILED")) else sys.stdout)
    if report:
        out.print(f"report: {report}")
    if result.failures:
        raise typer.Exit(2)


app.add_typer(export_app, name="export")

models_app = typer.Typer(no_args_is_help=True, help="Tile encoders: list them, fill the cache.")
app.add_typer(models_app, name="models")


@models_app.command("list")
def models_list() -> None:
    """The registered models: hub repo, output size, the resolution they expect, cached or not."""
    from embed.hub import cache_dir
    from embed.models import list_models

    table = Table(box=None, pad_edge=False)
    for col in ("name", "weights", "dim", "um/px", "tile", "gated", "cached"):
        table.add_column(col, overflow="fold")
    cache = cache_dir()
    for spec in list_models():
        cached = (
            "yes"
            if spec.source != "hf-hub"
            else ("yes" if (cache / f"models--{spec.repo.replace('/', '--')}").is_dir() else "no")
        )
        table.add_row(
            spec.name,
            spec.repo,
            str(spec.output_dim),
            str(spec.native_mpp or "-"),
            str(spec.tile),
            "yes" if spec.gated else "no",
            cached,
        )
    out.print(table)
    out.print(
        f"also: timm:<architecture> (random weights unless cached), local:<folder>; cache: {cache}",
        highlight=False,
    )


@models_app.command("pull")
def models_pull(
    name: str = typer.Argument(..., help="A registered model name."),
    hf_token: str | None = typer.Option(
        None, help="Hugging Face token (default: HF_TOKEN or the stored login)."
    ),
) -> None:
    """Download a model's config and weights into the HF cache, for offline compute nodes."""
    from embed.hub import pull
    from embed.models import get_model

    spec = get_model(name)
    if spec.source != "hf-hub":
        out.print(f"{name}: nothing to pull ({spec.source} weights)")
        return
    checkpoint = pull(name, spec.repo, token=hf_token)
    out.print(
        f"{name}: {checkpoint.repo} revision {checkpoint.revision} -> {checkpoint.weights}",
        highlight=False,
    )


class _progress:
    """A rich progress bar on stderr for one job; yields (progress, task id)."""

    def __init__(self, label: str) -> None:
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=err,
            transient=True,
        )
        self.label = label

    def __enter__(self):
        if err.is_terminal:
            self.progress.start()
        return self.progress, self.progress.add_task(self.label, total=None)

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()


def _error(exc: BaseException) -> None:
    print(f"tilestore: error: {' '.join(str(exc).split())}", file=sys.stderr)


def _warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"tilestore: warning: {message}", file=sys.stderr)


def main() -> None:
    """Console entry point: user mistakes become one line on stderr and exit code 2."""
    warnings.showwarning = _warning
    try:
        app()
    except TilestoreError as exc:
        _error(exc)
        sys.exit(2)
