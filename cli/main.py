"""The `tilestore` command: parses, prints, exits. The work happens in the library, reached
through its packages' public faces only (`tilestore`, `tilestore.embed`, `tilestore.plan`...)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import warnings
from pathlib import Path
from typing import NoReturn

import typer
from rich.markup import escape

from tilestore import OptionError, TilestoreError
from tilestore.cli.classify import classify
from tilestore.cli.console import (
    as_flags,
    flags_of,
    human_size,
    kept_on_interrupt,
    out,
    output_file,
    text_table,
)
from tilestore.cli.console import progress_bar as _progress
from tilestore.cli.embed import embed, models_app, patients
from tilestore.cli.export import export_app
from tilestore.cli.flags import From, store_place, with_flags, written
from tilestore.cli.inspect import info, verify
from tilestore.cli.learn import crossval, predict, train
from tilestore.cli.qc import qc
from tilestore.cli.status import status
from tilestore.cli.view import view
from tilestore.conversion import convert as run_convert
from tilestore.conversion import convert_many
from tilestore.embed import TIME_LIMIT, ask_stop, kept_at_stop
from tilestore.masks import compute_tissue
from tilestore.options import Workers, redacted, store_changed
from tilestore.plan import PlanOptions

try:  # typer >= 0.20 carries its own click
    from typer import TyperException as _UsageError
except ImportError:  # older typer: click's
    from click import ClickException as _UsageError

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Whole-slide images as OME-Zarr stores, tile plans and foundation-model embeddings.",
)


@app.command()
@with_flags
def convert(
    src: list[str] = typer.Argument(
        ...,
        help="Slide files (SVS, NDPI, OME-TIFF, QPTIFF, TIFF, DICOM, PNG, JPEG) or folders of "
        "DICOM files (one store per series); a URL (s3://, gs://, https://) is staged to the "
        "cache first.",
    ),
    output: Path = typer.Option(
        ...,
        "-o",
        "--output",
        help="Directory for <name>.ome.zarr stores, or a bucket's (s3://bucket/prefix, "
        "gs://...): each store built here, then uploaded, its root document last.",
        parser=store_place("--output"),
        metavar="<path>",
    ),
    options: dict = From(run_convert, exclude=("series", "progress", "tissue")),
    many: dict = From(convert_many, only=("at_once",)),
) -> None:
    """Convert slides once into chunked OME-Zarr 0.5 stores (or make in-place sidecars)."""
    from tilestore.conversion import (
        check_places,
        converted_store,
        file_sizes,
        no_sidecars_there,
        slides_at_once,
        slides_of,
    )
    from tilestore.format import one_store_each
    from tilestore.reading import sidecar_for
    from tilestore.sources import CACHE_LIMIT, check_urls, given

    if options.get("in_place"):
        no_sidecars_there(output, "--output")
    slides = [(given(path), series) for path in src for series in slides_of(path)]
    name = options.get("name")
    if name and len(slides) > 1:
        raise OptionError(f"--name {name}: names one store, but {len(slides)} slides were given")
    at_once = slides_at_once(len(slides), **many, sizes=file_sizes([p for p, _ in slides]))

    def target(path: Path) -> Path:
        return sidecar_for(path, output) if options.get("in_place") else output

    # a slide given again converted once; two (or two series) bound for one store: refused
    # before any is converted
    slides = [slides[i] for i in one_store_each(
        (path, series, target(path) if options.get("in_place")
         else converted_store(path, output, series, name))
        for path, series in slides
    )]  # fmt: skip
    check_urls(
        [path for path, _ in slides],
        options.get("in_place", False),
        limit_gb=options.get("cache_limit", CACHE_LIMIT),
    )
    if not options.get("in_place"):  # each store's place in a bucket, before any staging
        check_places(
            [converted_store(path, output, series, name) for path, series in slides],
            options.get("overwrite", False),
        )

    failed = 0
    if at_once == 1:  # one slide after another, each with its chunks' progress
        for path, series in slides:
            try:
                _staged(path, options)
                with _progress(f"{_named(path)}") as (progress, task):
                    report = run_convert(
                        path,
                        target(path),
                        series=series,
                        progress=lambda n, total: progress.update(task, advance=n, total=total),
                        **options,
                    )
            except TilestoreError as exc:
                _error(exc)
                failed += 1
                continue
            _converted(report)
    else:  # the slides spread over processes: one line for the cohort, each told in order
        with _progress(f"{len(slides)} slides, {at_once} at once") as (progress, task):
            progress.update(task, total=len(slides))
            for outcome in convert_many(
                slides,
                target,
                at_once=at_once,
                done=lambda _: progress.update(task, advance=1),
                **options,
            ):
                if outcome.error is not None:
                    _error(outcome.error)
                    failed += 1
                else:
                    _converted(outcome.report)
    if failed:
        raise typer.Exit(2)


def _named(path) -> str:
    """A slide as a progress line names it: a file's name, a URL as `shown`."""
    from tilestore.sources import is_url, shown

    return shown(path) if is_url(path) else Path(path).name


def _staged(path, options: dict) -> None:
    """A URL's slide staged to the cache, with a progress line in bytes (conversion then
    finds it staged); a local file is left as it is."""
    from tilestore.sources import CACHE_LIMIT, is_url, stage_slide

    if is_url(path):
        with _progress(f"staging {_named(path)}") as (progress, task):
            stage_slide(
                path,
                options.get("cache_limit", CACHE_LIMIT),
                lambda n, total: progress.update(task, advance=n, total=total),
            )


def _converted(report) -> None:
    """What one slide's conversion did: its store, codec and levels, size and time."""
    out.print(
        f"[bold]{report.store}[/bold]  {escape(report.summary())}, chunks {report.chunk} px",
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


@app.command()
@with_flags
def tissue(
    store: str = typer.Argument(..., help="A store made by `tilestore convert`."),
    options: dict = From(compute_tissue),
    preview: Path | None = typer.Option(
        None,
        help="Also write a PNG of the mask over the slide.",
        parser=written("--preview"),
        metavar="<path>",
    ),
    channel: str | None = typer.Option(
        None, help="Fluorescence: the nuclear channel, by name or index (default: DAPI/Hoechst)."
    ),
) -> None:
    """Compute the tissue mask and store it as the OME-Zarr label image labels/tissue."""
    from tilestore.analysis import save_preview
    from tilestore.masks import write_tissue
    from tilestore.reading import open_slide

    store = store_changed(store, "tilestore tissue")  # a URL: one line, before any work
    output_file(preview)
    slide = open_slide(store)
    mask = compute_tissue(slide, **options, **({"channel": channel} if channel else {}))
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
@with_flags
def plan(
    store: str = typer.Argument(..., help="A store (converted, or a slide's sidecar)."),
    overwrite: bool = typer.Option(False, help="Replace a plan of the same name."),
    preview: Path | None = typer.Option(
        None,
        help="Write a PNG: thumbnail, tissue, ROIs, tiles.",
        parser=written("--preview"),
        metavar="<path>",
    ),
    plan_options: PlanOptions = From(PlanOptions),
) -> None:
    """Plan the tiles to embed and store the plan in the slide's store."""
    from tilestore.analysis import save_preview
    from tilestore.embeddings import plan_slide
    from tilestore.masks import read_tissue
    from tilestore.plan import plan_rois, resolve_plan, save_plan
    from tilestore.reading import open_slide

    store = store_changed(store, "tilestore plan")  # a URL: one line, before any work
    output_file(preview)
    slide = open_slide(store)
    options = resolve_plan(plan_options, slide)
    made = plan_slide(slide, options)
    save_plan(slide, made, overwrite=overwrite)
    for note in made.notes:
        out.print(f"  {note}", highlight=False)
    rows, cols = made.spec.grid
    out.print(
        f"{store}: plan {made.name!r}: {len(made)} of {rows * cols} tiles, "
        f"{len(made.needed_chunks())} chunks of level {made.spec.level} "
        + (
            f"(effective {made.spec.effective_mpp:.4g} um/px)"
            if made.spec.effective_mpp
            else "(in level-0 pixels: the pixel size is not known)"
        ),
        highlight=False,
    )
    if preview:
        rois = plan_rois(slide, options) if options.roi else None  # as the plan used them
        save_preview(preview, slide, tissue=read_tissue(slide), rois=rois, plan=made)
        out.print(f"preview: {preview}")


@app.command()
@with_flags
def reshard(
    stores: list[str] = typer.Argument(..., help="Stores (.ome.zarr) made before shards."),
    workers: Workers = None,
) -> None:
    """Rewrite stores of one file per chunk into shards (a few files per slide), safely:
    nothing is decoded, and the old store is replaced only once the new one is whole. A
    store made before position checks gets them (its chunks' CRC-32C by position)."""
    from tilestore.conversion import reshard as run_reshard

    failed = 0
    for store in [store_changed(store, "tilestore reshard") for store in stores]:
        try:
            with _progress(store.name) as (progress, task):
                report = run_reshard(
                    store,
                    workers=workers,
                    progress=lambda n, total: progress.update(task, advance=n, total=total),
                )
        except TilestoreError as exc:
            _error(exc)
            failed += 1
            continue
        what = (
            f"{report.arrays} arrays into shards, {report.kept} kept"
            if report.arrays
            else "already in shards" + ("" if report.positions else ", left as it was")
        )
        if report.positions:
            what += f"; chunk positions recorded for {report.positions} levels"
        out.print(
            f"{store}: {what}; {report.files_before:,} -> {report.files_after:,} files "
            f"in {report.seconds:.1f} s",
            highlight=False,
        )
    if failed:
        raise typer.Exit(2)


app.command()(embed)
app.command()(patients)
app.command()(info)
app.command()(verify)
app.command()(status)
app.command()(qc)
app.command()(view)
app.command()(classify)
app.command()(crossval)
app.command()(train)
app.command()(predict)
app.add_typer(models_app, name="models")
app.add_typer(export_app, name="export")


def _flags() -> dict:
    """Every command's flags by parameter name, to put library messages in their terms."""
    callbacks = [c.callback for c in app.registered_commands]
    for group in app.registered_groups:
        callbacks += [c.callback for c in group.typer_instance.registered_commands]
    return flags_of(*callbacks)


def _error(exc: BaseException) -> None:
    """Every error line the command prints: one line, the API's words as its flags, any URL
    in it without its user, password or query (a library's words quote what it asked)."""
    message = as_flags(redacted(" ".join(str(exc).split())), _flags())
    print(f"tilestore: error: {message}", file=sys.stderr)


def _warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"tilestore: warning: {as_flags(redacted(str(message)), _flags())}", file=sys.stderr)


@app.callback()
def _options(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks (for bug reports)."),
) -> None:
    """Whole-slide images as OME-Zarr stores, tile plans and foundation-model embeddings."""


INTERRUPTED = "tilestore: interrupted ({signal}): {kept}; the same command carries on from there"
TIME_LIMIT_LINE = (
    "tilestore: the time limit is near ({signal}): stopped after the batch in flight; {kept}; "
    "the same command carries on from there"
)
# what a command that says nothing more of it kept (`tilestore.cli.console.kept_on_interrupt`)
KEPT = "what was finished is kept (converted stores, embedded batches, QC'd slides)"


def main() -> None:
    """Console entry point: every failure is one line on stderr and exit code 2; a
    traceback only with --debug. A command that ends (well or with its error) ends the
    process at once (`_leave`).

    Ctrl-C (SIGINT) and SIGTERM (what SLURM sends at a time limit or a preemption, and
    `kill`'s default) stop a command alike: KeyboardInterrupt in the main thread, so every
    `finally` runs (worker processes stopped, stores closed), then `INTERRUPTED` and exit
    128 + the signal (130, 143). The signal is noted here because typer turns the
    KeyboardInterrupt into a silent exit 130, so `_main` never sees it; the
    KeyboardInterrupt carries its name, for a command that writes it down (embed's report).
    A command that ends well all the same (the viewer stops on Ctrl-C) exits as it says;
    one that said what it kept (`kept_on_interrupt`: embed names the stores finished and
    the tiles kept) has it in the line.

    SIGUSR1 (`tilestore.stopping.TIME_LIMIT`: what `#SBATCH --signal=B:USR1@60` has the
    batch script pass on) is the same stop, taken where nothing computed is lost: a run
    embedding batches finishes the batch in flight, writes the shard it was filling and
    stops there; elsewhere at once. `TIME_LIMIT_LINE` says so and what was kept; exit 138
    (128 + SIGUSR1), which a batch script tells from a finished run to requeue itself."""
    caught: list[int] = []

    def interrupt(signum: int, frame: object) -> None:
        caught.append(signum)
        if signum == TIME_LIMIT and ask_stop(signum):
            return  # the run stops at its next batch (`tilestore.stopping.Stopped`)
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for signum in (signal.SIGINT, signal.SIGTERM, TIME_LIMIT):
        if signal.getsignal(signum) is not signal.SIG_IGN:  # ignored (a script's `&` job): stays so
            signal.signal(signum, interrupt)
    try:
        _main()
        code: int | str | None = 0
    except SystemExit as done:
        code = done.code
    if caught and code not in (0, None):
        name = signal.Signals(caught[0]).name
        if caught[0] == TIME_LIMIT:
            kept = "; ".join(kept_at_stop()) or kept_on_interrupt.said or KEPT
            print(TIME_LIMIT_LINE.format(signal=name, kept=kept), file=sys.stderr)
        else:
            print(INTERRUPTED.format(signal=name, kept=kept_on_interrupt.said or KEPT),
                  file=sys.stderr)  # fmt: skip
        code = 128 + caught[0]
    _leave(code)


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
        # click reports its own parse errors in several lines: they come here instead, to
        # be said as every other error is (typer still turns Ctrl-C into a quiet 130)
        code = app(standalone_mode=False)
    except _UsageError as exc:  # typer's click: a usage error, one line
        ctx = getattr(exc, "ctx", None)
        where = f" (see {ctx.command_path} --help)" if ctx is not None else ""
        _error(f"{exc.format_message()}{where}")
        sys.exit(getattr(exc, "exit_code", 2))
    except (KeyboardInterrupt, typer.Abort):  # the signal's handler in `main` says it
        sys.exit(130)
    except TilestoreError as exc:
        if debug:
            raise
        _error(exc)
        sys.exit(2)
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
    sys.exit(code if isinstance(code, int) else 0)
