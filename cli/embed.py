"""`tilestore embed` (one process, or a Dask cluster), `tilestore patients` and
`tilestore models`."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import typer
from rich.console import Console

from tilestore import OptionError, TilestoreError
from tilestore.cli.console import (
    as_flags,
    err,
    flags_of,
    kept_on_interrupt,
    line_printer,
    out,
    output_file,
    text_table,
)
from tilestore.cli.console import progress_bar as _progress
from tilestore.cli.dask import CLUSTER, SCHEDULER, dask_client
from tilestore.cli.flags import From, with_flags, written
from tilestore.embed import (
    BAD_INPUT,
    BATCHES,
    REPEATS,
    SLICE_TILES,
    BatchSizes,
    Options,
    Preparation,
    Repeats,
    Share,
    SliceTiles,
    SlidesAtOnce,
    Stager,
    brief_report,
    check_stores,
    ended,
    exit_code,
    interrupted_code,
    kept_said,
    model_record,
    parse_shard,
    write_report,
)
from tilestore.embed.slides import SlidePrecision
from tilestore.options import Workers
from tilestore.plan import PlanOptions
from tilestore.reading import OverrideMpp, ScanMpp
from tilestore.sources import check_urls, given, is_url


@with_flags
def embed(
    stores: list[str] = typer.Argument(
        ...,
        help="Stores, or slide files or their URLs (s3://, https://...: converted into --into "
        "first, the next while the GPU embeds the current one); one model load for all.",
    ),
    in_place: bool = typer.Option(
        False,
        "--in-place",
        help="Read TIFF slides (SVS, OME-TIFF, NDPI) where they are, through a sidecar "
        "store each (<slide>.tilestore.zarr, in --sidecars), instead of converting them.",
    ),
    sidecars: Path | None = typer.Option(
        None,
        parser=written("--sidecars"),
        metavar="<path>",
        help="--in-place: the folder for the sidecars (default: beside each slide; name one "
        "where the slides are read-only).",
    ),
    scan_mpp: ScanMpp = None,
    override_mpp: OverrideMpp = False,
    at_once: SlidesAtOnce = 1,
    into: Path = typer.Option(
        Path("stores"),
        parser=written("--into"),
        metavar="<path>",
        help="Folder for the stores of slide files given (an existing store "
        "of the same slide there is reused); on Dask, one every worker reaches, where the "
        "workers convert them.",
    ),
    model: str | None = typer.Option(
        None,
        help="Model name (see `tilestore models list`), timm:<arch>, local:<dir> or "
        "random:<name>; with --slide-encoder, its tile model by default.",
    ),
    slide_encoder: str | None = typer.Option(
        None,
        "--slide-encoder",
        help="Then a slide embedding per store from its tile features "
        "(embeddings/<model>/<plan>/slides/<encoder>): titan, prism, gigapath, chief, madeleine, "
        "feather, mean, max... The tiles are embedded first where they are not, with the "
        "tile model, um/px and tile size the encoder was trained on.",
    ),
    slide_weights: Path | None = typer.Option(
        None,
        "--slide-weights",
        help="--slide-encoder: a local copy of its weights file (CHIEF's come from its "
        "authors' Google Drive, not the Hub).",
    ),
    plan: str | None = typer.Option(
        None, help="A stored plan (default: the store's only plan, else a new one)."
    ),
    report: Path | None = typer.Option(
        None,
        help="Write the run report as JSON here.",
        parser=written("--report"),
        metavar="<path>",
    ),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="Say what would be embedded and about how long it would take "
        "(model loaded, stores planned, a short calibration); write nothing.",
    ),
    cluster: str | None = CLUSTER,
    scheduler: str | None = SCHEDULER,
    workers: Workers = None,
    slice_tiles: SliceTiles = SLICE_TILES,
    shard: Share = None,
    options: Options = From(Options),
    plan_options: PlanOptions | None = From(PlanOptions, empty_none=True),
) -> None:
    """Embed plan tiles with a foundation model; write embeddings/<model>/<plan> into each store.

    Exit status (one table: `tilestore.embed.outcome`; the report's `outcome` says the same):
    0: complete: every store is complete (embedded now or before); an empty share too.
    3: partial: some stores failed (each named on stderr), the others are complete: rerun.
    2: nothing done: every store failed or was refused, or the command itself was.
    130, 143: interrupted (SIGINT, SIGTERM): the stores finished and tiles kept are said."""
    if plan and plan_options:
        raise OptionError("--plan names a stored plan: plan options cannot change it")
    if sidecars and not in_place:
        raise OptionError("--sidecars is where --in-place keeps its sidecars: add --in-place")
    if at_once != 1 and (cluster or scheduler):  # there, as many at once as the workers
        raise OptionError(f"--at-once {at_once}: on Dask each worker makes its own slides "
                          "ready, one at a time: add workers instead")  # fmt: skip
    output_file(report)  # the door: its folder made and writable, or one line before any work
    stores = [given(s) for s in stores]  # paths; a URL kept as text
    urls = [s for s in stores if is_url(s)]
    check_urls(urls, in_place)  # each found and allowed (one request), before any work
    # a dry run writes nothing, not even its report
    ran = _Ran(None if dry_run else report, model or slide_encoder or "", len(stores))
    try:
        if options.profile == "torch":
            output_file(Path(options.profile_out))
        slide_spec = None
        if slide_encoder:
            slide_spec, model, plan_options, options = _slide_plan(
                slide_encoder, model, plan_options, options, plan
            )
            _guides(stores, slide_spec, plan_options)
        elif slide_weights:
            raise OptionError("--slide-weights goes with --slide-encoder")
        if model is None:
            raise OptionError("--model: which model embeds the tiles? (or --slide-encoder)")
        model = model_record(model)  # the run's one record of its model, passed along
        choice = plan or plan_options
        ran.model = model.name
        if not (cluster or scheduler):  # (on Dask a slide bound for a store being made waits)
            # an input given again taken once; two bound for one store refused before
            # anything is read or written, over all of them (before a share is taken)
            how = Preparation.of(into, choice, in_place=in_place, sidecars=sidecars)
            stores = how.once_each(stores)
            ran.given = len(stores)
        if shard:  # `shard` and what it reads are light: an empty share ends before torch
            from tilestore.embed import shard as share

            k, n = parse_shard(shard)
            stores = [given(s) for s in share(stores, k, n)]
            out.print(f"shard {k}/{n}: {len(stores)} store(s)", highlight=False)
            ran.share = {"k": k, "n": n, "stores": len(stores), "of": ran.given}
            ran.given = len(stores)
            if not stores:
                ran.brief(f"share {k}/{n} is empty: the {ran.share['of']} store(s) given "
                          "fall to the others")  # fmt: skip
                ran.save(0)
                return
        if dry_run:
            _dry_run(stores, model, choice, options, into, in_place, sidecars)
            return
        # what the stores' metadata refuses, before torch is imported and the model loaded
        ran.checked = checked = check_stores(stores, model, choice, options)
        stores = checked.kept
        if not stores or cluster or scheduler:  # else the run's report says them
            for store, why in checked.skipped:  # plain print: never wrap a line
                print(f"  skipped {store}: {as_flags(why, flags_of(embed))}")
            for store, why in checked.refused:
                print(f"tilestore: error: {store}: {as_flags(why, flags_of(embed))}",
                      file=sys.stderr)  # fmt: skip
        if not stores:  # every store complete already, or refused: no model loaded
            ran.brief()
            done = [str(store) for store, _ in checked.skipped]
            code = _outcome(done, len(checked.refused), slide_spec, model.name, options,
                            slide_weights)  # fmt: skip
        elif cluster or scheduler:
            from tilestore.format import is_store

            slides = [str(s) for s in stores if Path(s).exists() and not is_store(s)]
            if slides and in_place:
                raise OptionError(
                    f"{slides[0]}: --in-place is not run on Dask: give --into DIR (a folder "
                    "every worker reaches), where the workers convert the slides"
                )
            result = _embed_on_dask(stores, model, choice, options, cluster, scheduler,
                                    workers, slice_tiles, into, scan_mpp, override_mpp)  # fmt: skip
            done = [s["store"] for s in result.slides] + list(result.skipped_complete)
            ran.data = result.to_json() | {
                "finished": list(done),
                "skipped": [{"store": str(s), "why": why} for s, why in checked.skipped],
                "refused": [{"store": str(s), "error": why} for s, why in checked.refused],
            }
            done += [store for store, _ in checked.skipped]
            failed = len(result.failures) + len(checked.refused)  # refused: said above
            code = _outcome([str(d) for d in done], failed, slide_spec, model.name, options,
                            slide_weights)  # fmt: skip
        else:
            result = _embed_here(stores, model, choice, options, into, in_place, sidecars,
                                 scan_mpp, override_mpp, at_once, checked)  # fmt: skip
            ran.data = result.to_json()
            done = [s["store"] for s in result.slides if not s.get("failed")]
            done += [s["store"] for s in result.skipped]
            failed = len(result.failures)  # the refused among them, as the run's report says
            code = _outcome([str(d) for d in done], failed, slide_spec, model.name, options,
                            slide_weights)  # fmt: skip
    except KeyboardInterrupt as stop:  # Ctrl-C, SIGTERM: said and written down, then main's line
        ran.interrupted(stop)
        raise
    except (TilestoreError, OSError) as exc:  # refused: main says it; the report too
        ran.refused(exc)
        raise
    ran.save(code)
    if code:
        raise typer.Exit(code)


class _Ran:
    """What `embed` tells of its run at the end, however it ends: the report (`--report`,
    written by `tilestore.embed.write_report`, whole or not at all, a failure a warning
    that leaves the exit status as it is) and, where a signal stops it, what it kept."""

    def __init__(self, path: Path | None, model: str, given: int) -> None:
        self.path, self.model, self.given = path, model, given
        self.share: dict | None = None  # --shard: K, N, its stores, of how many
        self.checked = None  # what the stores' metadata said (`check_stores`), once known
        self.data: dict | None = None  # the run's report, once it has one

    def brief(self, note: str | None = None) -> None:
        """The report of a run that embedded nothing (an empty share, every store skipped
        or refused, a run stopped before its model loaded)."""
        checked = self.checked
        self.data = brief_report(self.model, skipped=checked.skipped if checked else (),
                                 failed=checked.refused if checked else (), note=note)  # fmt: skip

    def save(self, code: int, refused: bool = False) -> None:
        if self.path is None:
            return
        if self.data is None:
            self.brief()
        data = self.data | ({"share": self.share} if self.share else {})
        if write_report(self.path, ended(data, code, refused=refused)):
            out.print(f"report: {self.path}", highlight=False)

    def interrupted(self, stop: KeyboardInterrupt) -> None:
        """A signal stopped the run: its report (the engine's, with the stores finished and
        the tiles kept of the others, where it had started) and the line's words."""
        run = getattr(stop, "report", None)  # `tilestore.errors.Interrupted`'s
        if run is not None:
            self.data = run.to_json()
        elif self.data is None:
            self.brief()
        kept_on_interrupt.say(kept_said(self.data, self.given))
        self.save(interrupted_code(str(stop) or "SIGINT"))

    def refused(self, exc: BaseException) -> None:
        if self.data is None:
            self.brief()
        where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        self.data = self.data | {"error": f"{where}{getattr(exc, 'strerror', None) or exc}"}
        self.save(BAD_INPUT, refused=True)


def _outcome(done: list[str], failed: int, slide_spec, model, options, weights) -> int:
    """The exit status (`tilestore.embed.outcome`), once the slide encoder, if asked, has
    run over the stores done: a store whose slide vector failed is failed, not done."""
    if slide_spec:
        lost = _slides(done, slide_spec.name, model, options, weights)
        done, failed = [d for d in done if d not in lost], failed + len(lost)
    return exit_code(len(done), failed)


def _embed_here(stores, model, choice, options, into, in_place, sidecars, scan_mpp,
                override_mpp, at_once, checked):  # fmt: skip
    """The run in this process (slide files converted or read in place on the way)."""
    # slides start converting in worker processes before this one imports torch
    staging = Stager(stores, into, choice, in_place=in_place, sidecars=sidecars,
                     scan_mpp=scan_mpp, override_mpp=override_mpp, at_once=at_once)  # fmt: skip
    from tilestore.embed import embed as run_embed
    from tilestore.embed import format_report

    with _progress(f"embedding with {model.name}") as (progress, task):
        result = run_embed(
            staging,
            model,
            plan=choice,
            options=options,
            progress=lambda n, total: progress.update(task, advance=n, total=total),
            checked=checked,
            say=line_printer(progress),
        )
    for line in format_report(result):  # plain print: never wrap a line
        failed = line.startswith(("WARNING", "tilestore: error"))
        print(as_flags(line, flags_of(embed)), file=sys.stderr if failed else sys.stdout)
    return result


def _slide_plan(
    name: str, model: str | None, plan_options: PlanOptions | None, options, plan: str | None
):
    """The slide encoder, the tile model's record (resolved here, once for the run), and
    the plan and run options that give the encoder its tiles: the library's rule
    (`tilestore.embed.slides.encoder_tiles`)."""
    from tilestore.embed import model_record
    from tilestore.embed.slides import encoder_tiles, get_slide_encoder, tile_model_for

    spec = get_slide_encoder(name)
    model_spec = model_record(tile_model_for(spec, model))
    plan_options, options = encoder_tiles(spec, model_spec, plan_options, plan, options)
    return spec, model_spec, plan_options, options


def _guides(stores, spec, plan_options) -> None:
    """An encoder guided by a second tile model's features (EAGLE): refused in one line
    where a store lacks them, before its tiles are embedded (`guides_missing`)."""
    from tilestore.embed.slides import guides_missing

    if spec.guide is not None:
        guides_missing(stores, spec, plan_options)


def _slides(stores, encoder, model, options, weights) -> set[str]:
    """The slide encoder over the stores whose tiles are embedded (none: nothing done);
    return the stores it failed on (not complete: their slide vector was asked for)."""
    from tilestore.embed.slides import embed_slides

    if not stores:
        return set()
    with _progress(f"slide embeddings with {encoder}") as (progress, task):
        result = embed_slides(
            stores,
            encoder,
            model=model,
            device=options.device,
            overwrite=options.overwrite,
            token=options.hf_token,
            weights=weights,
            progress=lambda n, total: progress.update(task, advance=n, total=total),
        )
    for line in result.lines():
        failed = line.startswith("tilestore: error")
        print(as_flags(line, flags_of(embed)), file=sys.stderr if failed else sys.stdout)
    return {row.store for row in result.failures}


def _dry_run(stores, model, plan, options, into, in_place, sidecars) -> None:
    from tilestore.embed import dry_run

    result = dry_run(
        stores,
        model,
        plan=plan,
        options=options,
        convert_into=into,
        in_place=in_place,
        sidecars=sidecars,
    )
    table = text_table("input", "plan tiles", "done", "to do", "est. s", "note")
    for row in result.rows:
        show = lambda v: "-" if v is None else f"{v:,}"  # noqa: E731
        table.add_row(
            row.given,
            show(row.tiles),
            show(row.done),
            show(row.todo),
            "-" if row.seconds is None else f"{row.seconds:.1f}",
            "refused (below)" if row.error else row.note,
        )
    out.print(table)
    out.print(f"decode {result.decode} ({result.decode_why})", highlight=False)
    memory = f", peak GPU memory {result.peak_gpu_mb:,.0f} MB" if result.peak_gpu_mb else ""
    out.print(
        f"{result.model} on {result.device_name}, batch {result.batch_size}: "
        f"{result.tiles_per_s:,.0f} tiles/s for the model alone{memory}; set-up took "
        f"{result.setup_s:.1f} s. In all {result.todo:,} tiles to do, about "
        f"{result.seconds:.0f} s of model time (a run reaches 0.77-0.99 of it). Nothing "
        "was written.",
        highlight=False,
    )
    for row in result.rows:  # each refusal in one line, as the run would say it
        if row.error:
            print(f"tilestore: error: {as_flags(row.error, flags_of(embed))}", file=sys.stderr)
    if any(row.error for row in result.rows):
        raise typer.Exit(2)


def _embed_on_dask(stores, model, plan, options, cluster, scheduler, workers, slice_tiles, into,
                   scan_mpp, override_mpp):  # fmt: skip
    from tilestore.embed import embed_cohort, summary_lines

    client, share = dask_client(cluster, scheduler, workers)
    with client, _progress(f"embedding with {model.name} on Dask") as (progress, task):
        bar = (
            (lambda n, total: progress.update(task, advance=n, total=total))
            if err.is_terminal
            else None
        )
        result = embed_cohort(
            stores,
            model,
            client,
            plan=plan,
            options=options,
            into=into,
            scan_mpp=scan_mpp,
            override_mpp=override_mpp,
            slice_tiles=slice_tiles,
            cpus_per_worker=share,
            progress=bar,  # else the cohort's own lines: tiles, rate, time left, workers alive
        )
        if cluster:
            client.cluster.close()
    for line in summary_lines(result):
        failed = line.startswith(("tilestore: error", "WARNING"))
        print(as_flags(line, flags_of(embed)), file=sys.stderr if failed else sys.stdout)
    return result


@with_flags
def patients(
    stores: list[str] = typer.Argument(
        ..., help="Stores with the encoder's slide embeddings, or a quoted glob."
    ),
    table: Path = typer.Option(
        ...,
        "--table",
        "-t",
        help="A .csv or .tsv with the columns slide and patient (a slide: its store's name "
        "without .ome.zarr, as `tilestore export slides` writes it).",
    ),
    output: Path = typer.Option(
        ...,
        "-o",
        "--output",
        help="A .parquet, .csv or .h5ad (AnnData) file: a row per patient.",
        parser=written("--output"),
        metavar="<path>",
    ),
    slide_encoder: str = typer.Option(
        "moozy", "--slide-encoder", "-s", help="A slide encoder that makes patient vectors."
    ),
    model: str | None = typer.Option(
        None, "--model", "-m", help="The tile model its slide vectors read (default: its own)."
    ),
    slide_weights: Path | None = typer.Option(
        None, "--slide-weights", help="A local copy of the encoder's weights file."
    ),
    precision: SlidePrecision = "auto",
    overwrite: bool = typer.Option(False, help="Replace an existing output file."),
    options: Options = From(Options, only=("device", "hf_token")),
) -> None:
    """A vector per patient from its slides' vectors, by the encoder's own patient model
    (MOOZY's case transformer; EAGLE's: from the tiles of all its slides at once), written
    as a table: patient, slides, n_slides, f0, f1, ...

    The slide vectors come first: `tilestore embed STORES --slide-encoder moozy`. The table
    is checked before anything is computed: a missing column, a slide in two patients, a
    slide no store given holds or a store no row names is one error naming the row."""
    from tilestore.embed.slides import embed_patients

    output_file(output)
    found = embed_patients(
        stores,
        table,
        output,
        encoder=slide_encoder,
        model=model,
        device=options.device,
        precision=precision,
        token=options.hf_token,
        weights=slide_weights,
        overwrite=overwrite,
    )
    out.print(
        f"{found.patients} patient(s) from {found.slides} slide(s), {found.encoder} "
        f"({found.device}, {found.precision}) -> {found.output}",
        highlight=False,
    )


models_app = typer.Typer(no_args_is_help=True, help="Tile encoders: list them, fill the cache.")


@models_app.command("list")
def models_list() -> None:
    """The registered encoders: their weights, the library whose code builds them (ours:
    the authors' construction written here), output size, the resolution and tile they
    expect, how their features are pooled, licence, gating, whether their weights are in
    the cache, and the text tower `tilestore classify` scores their tiles with
    (zero-shot)."""
    from tilestore.embed import is_cached, list_models

    table = text_table(
        "name", "weights", "code", "dim", "um/px", "tile", "pooling", "licence", "gated",
        "cached", "zero-shot",
    )  # fmt: skip
    for spec in list_models():
        table.add_row(
            spec.name,
            spec.repo,
            spec.code,
            str(spec.output_dim),
            str(spec.native_mpp or "-"),
            str(spec.tile),
            spec.pooling + (f" + {spec.projection} projection" if spec.projection else ""),
            spec.licence or "-",
            "yes" if spec.gated else "no",
            "yes" if is_cached(spec) else "no",
            spec.text or "-",
        )
    # piped or logged, every hub id whole on one line (a terminal folds them to its width)
    wide = out if out.is_terminal else Console(width=240)
    wide.print(table)
    zero_shot = [s.name for s in list_models() if s.text]
    out.print(
        f"{len(zero_shot)} with a zero-shot text tower ({', '.join(zero_shot)}): "
        "`tilestore classify STORE --model NAME --prompts FILE`",
        highlight=False,
    )
    out.print(
        f"{len(list_models())} encoders; also: timm:<architecture> (timm's weights, from the "
        "cache: `tilestore models pull`), local:<folder>, random:<name> (a registered or timm "
        "architecture, random weights drawn from a fixed seed)",
        highlight=False,
    )
    from tilestore.embed.slides import list_slide_encoders, slide_is_cached

    slides = text_table(
        "slide encoder", "reads", "um/px", "tile", "dim", "patients", "weights", "licence",
        "gated", "precision", "cached",
    )  # fmt: skip
    for spec in list_slide_encoders():
        slides.add_row(
            spec.name,
            spec.tile_model or "any tile model",
            str(spec.mpp or "-"),
            str(spec.tile or "-"),
            str(spec.output_dim or "the tiles'"),
            "yes" if spec.patients else "no",
            spec.repo or ("none" if spec.source == "none" else f"{spec.weights_file} (a file)"),
            spec.licence or "-",
            "yes" if spec.gated else "no",
            spec.precision if spec.source != "none" else "-",
            "-" if spec.source == "file" else "yes" if slide_is_cached(spec) else "no",
        )
    wide.print(slides)
    out.print(
        f"{len(list_slide_encoders())} slide encoders: `tilestore embed --slide-encoder NAME` "
        "embeds the tiles it reads if they are not, then the slide; `tilestore patients` "
        "makes a vector per patient with those whose patients column says yes",
        highlight=False,
    )


@models_app.command("pull")
@with_flags
def models_pull(
    name: str = typer.Argument(..., help="A registered model name."),
    options: Options = From(Options, only=("hf_token",)),
) -> None:
    """Download a model's config and weights into the HF cache, for offline compute nodes; a
    slide encoder's weights and those of the tile model it reads."""
    from tilestore.embed import pull
    from tilestore.embed.slides import SLIDE_REGISTRY, pull_slide_encoder

    hf_token = options.hf_token
    if name in SLIDE_REGISTRY:
        found = pull_slide_encoder(name, token=hf_token)
        where = (
            f"{found.repo} revision {found.revision} -> {found.weights}"
            if found
            else ("nothing to pull (no weights, or a file from its authors: --slide-weights)")
        )
        out.print(f"{name}: {where}", highlight=False)
        spec = SLIDE_REGISTRY[name]
        if spec.guide is not None:  # EAGLE's chief-ctranspath, beside its tile model
            guide = pull(spec.guide, token=hf_token)
            out.print(f"{spec.guide}: {guide.weights if guide else 'nothing to pull'}")
        name = spec.tile_model
        if name is None:
            return
    checkpoint = pull(name, token=hf_token)
    if checkpoint is None:
        out.print(f"{name}: nothing to pull (its weights do not come from the hub)")
        return
    out.print(
        f"{name}: {checkpoint.repo} revision {checkpoint.revision} -> {checkpoint.weights}",
        highlight=False,
    )


@models_app.command("compile")
@with_flags
def models_compile(
    name: str = typer.Argument(..., help="Model name, timm:<arch>, local:<dir> or random:<name>."),
    like: Path | None = typer.Option(
        None,
        help="A store of the cohort: its plan gives the tiles' read size (default: the "
        "model's tile; a 40x slide read at 0.5 um/px without such a level reads larger "
        "windows, another compiled shape).",
    ),
    plan: str | None = typer.Option(None, help="--like: which stored plan (as `embed --plan`)."),
    options: Options = From(
        Options,
        only=(
            "batch_size",
            "device",
            "precision",
            "compile_cache",
            "tokens",
            "quality",
            "any_scale",
            "hf_token",
        ),
    ),
) -> None:
    """Compile a model into the compile cache ahead of a SLURM array (`embed --compile
    --compile-cache DIR` with the same model, batch size, device and precision), so that no
    task of the array compiles."""
    from tilestore.embed import compile_ahead

    result = compile_ahead(name, options, like=like, plan=plan, say=_say)
    what = f"{result.model}, batch {result.batch} of {result.read} px tiles on {result.device}"
    for note in result.notes:
        print(note, file=sys.stderr)
    # plain print: the entry's path whole on one line, for scripts and logs
    if not result.compiled:
        print(f"{what}: in the compile cache already: {result.entry} ({result.seconds:.1f} s)")
        return
    print(f"{what}: compiled in {result.seconds:.1f} s -> {result.entry}")


def _say(line: str) -> None:
    """A line the library says as it works, on stderr at once (a SLURM log too)."""
    print(line, file=sys.stderr, flush=True)


@models_app.command("profile")
@with_flags
def models_profile(
    name: str = typer.Argument(..., help="Model name, timm:<arch>, local:<dir> or random:<name>."),
    batches: BatchSizes = BATCHES,
    options: Options = From(Options, only=("device", "precision", "hf_token")),
    repeats: Repeats = REPEATS,
    plot: Path | None = typer.Option(
        None,
        help="Also plot tiles/s and memory to this PNG.",
        parser=written("--plot"),
        metavar="<path>",
    ),
    json_out: Path | None = typer.Option(
        None,
        "--json",
        help="Also write the numbers here.",
        parser=written("--json"),
        metavar="<path>",
    ),
) -> None:
    """Tiles/s and peak GPU memory per batch size (random tiles), to size a GPU request."""
    from tilestore.embed import plot_profile, profile_model

    output_file(plot)
    output_file(json_out)
    profile = profile_model(
        name,
        batches,
        device=options.device,
        precision=options.precision,
        repeats=repeats,
        token=options.hf_token,
    )
    memory = (
        f"; the model alone {profile.model_mb:,.0f} MB of {profile.total_mb:,.0f} MB"
        if profile.total_mb
        else ""
    )
    out.print(f"{name} on {profile.device_name}, {profile.precision}{memory}", highlight=False)
    table = text_table("batch", "tiles/s", "peak GPU MB", "per tile MB")
    for run in profile.runs:
        fits = run.tiles_per_s is not None
        peak = run.peak_mb
        table.add_row(
            str(run.batch),
            f"{run.tiles_per_s:,.0f}" if fits else "out of memory",
            f"{peak:,.0f}" if peak else "-",
            f"{(peak - (profile.model_mb or 0)) / run.batch:.2f}" if peak else "-",
        )
    out.print(table)
    if any(r.tiles_per_s for r in profile.runs):
        out.print(f"--batch-size auto would take {profile.choose()}", highlight=False)
    if plot:
        plot_profile(profile, plot)
        out.print(f"plot: {plot}")
    if json_out:
        json_out.write_text(json.dumps(asdict(profile), indent=2))
        out.print(f"json: {json_out}")
