"""`tilestore export ...`: one subcommand per export of the library's registry
(`tilestore.exports.EXPORTS`), its help taken from there and its writer called as named
there; the command parses the flags, opens what the writer reads and prints what it wrote."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from tilestore.analysis import (
    CLUSTERS,
    MAX_CLUSTERS,
    PCS,
    Clusters,
    OptionalClusters,
    OptionalComponents,
)
from tilestore.cli.console import output_file
from tilestore.cli.flags import From, with_flags
from tilestore.embeddings import ScaleLabel
from tilestore.exports import EXPORTS, H5Layout, get_export, to_ome_tiff
from tilestore.options import Opt
from tilestore.view import TileIndex


def _group_help() -> str:
    """The group's help: what the exports read, each with the exports that read it."""
    reads: dict[str, list[str]] = {}
    for export in EXPORTS:
        reads.setdefault(export.reads, []).append(export.name)
    return (
        "Out to other tools' files: "
        + "; ".join(f"{what} ({', '.join(names)})" for what, names in reads.items())
        + "."
    )


export_app = typer.Typer(no_args_is_help=True, help=_group_help())
out = Console()


def _export(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a command as the export `name`: its flags generated (`with_flags`), its help
    the registry's line followed by the command's docstring (how to use it), and the
    registry's line, with what it reads and writes, in the group's list."""
    export = get_export(name)

    def register(command: Callable[..., Any]) -> Callable[..., Any]:
        # each paragraph on one line: typer keeps a docstring's line breaks after the first
        paragraphs = (inspect.getdoc(command) or "").split("\n\n")
        text = "\n\n".join([export.help, *(" ".join(p.split()) for p in paragraphs if p)])
        return export_app.command(name, help=text, short_help=export.summary)(with_flags(command))

    return register


def _writer(name: str) -> Callable[..., Any]:
    """The function the registry names as the writer of export `name`."""
    return get_export(name).load()


MODEL = typer.Option(..., "--model", "-m", help="The model the store was embedded with.")


SKIP_MISSING = typer.Option(
    False,
    "--skip-missing",
    help="Leave out, with a warning, stores without this model's finished embeddings "
    "(stores a quoted glob finds are always left out so).",
)


PLAN = typer.Option(
    None,
    "--plan",
    help="The plan whose embeddings are read, where a store holds the model's of several "
    "(default: each store's only one).",
)


def _analysed(stores, model, clusters=None, pcs=PCS, components=False, **reading):
    """The shared analysis step (`tilestore.exports.analyse_tiles`): the stores opened as
    one cohort, their clusters and PCs where asked."""
    from tilestore.exports import analyse_tiles

    return analyse_tiles(
        [str(s) for s in stores], model, clusters=clusters, pcs=pcs, components=components,
        **reading,
    )  # fmt: skip


@_export("ome-tiff")
def ome_tiff(
    store: Path = typer.Argument(..., help="A store made by `tilestore convert`."),
    output: Path = typer.Option(..., "-o", "--output", help="The .ome.tiff to write."),
    options: dict = From(to_ome_tiff, only=("compression",)),
    labels: bool = typer.Option(False, help="Also write the label images (tissue)."),
    overwrite: bool = typer.Option(False, help="Replace an existing file."),
) -> None:
    output_file(output)
    result = _writer("ome-tiff")(store, output, labels=labels, overwrite=overwrite, **options)
    for index, level in enumerate(result.levels):
        _, h, w = level["shape"]
        out.print(f"level {index}: {w}x{h}, {level['tiles']} tiles, {level['how']}")
    if result.labels:
        out.print(f"labels: {', '.join(result.labels)}")
    out.print(
        f"{result.path}: {result.bytes / 2**20:.1f} MB in {result.seconds:.1f} s", highlight=False
    )


@_export("qupath")
def qupath(
    store: Path = typer.Argument(..., help="An embedded store."),
    model: str = MODEL,
    clusters: OptionalClusters = None,
    pcs: OptionalComponents = PCS,
    output: Path | None = typer.Option(
        None, "-o", "--output", help="GeoJSON file (default: <slide>.<model>.geojson here)."
    ),
    plan: str | None = PLAN,
) -> None:
    """In QuPath: File > Import objects from file, over the ORIGINAL slide (same pixels)."""
    from tilestore.embeddings import model_folder

    output_file(output)
    found = _analysed([store], model, clusters, pcs, components=True, plan=plan)
    ds = found.ds
    name = ds.tiles.slides[0]
    target = output or Path(f"{name}.{model_folder(model).split('/')[-1]}.geojson")
    _writer("qupath")(ds, target, clusters=found.clusters, measurements=found.components)
    out.print(f"{name}: {ds.sizes['tile']} tiles -> {target}", highlight=False)


@_export("anndata")
def anndata(
    stores: list[str] = typer.Argument(..., help="Embedded stores, or a quoted glob."),
    model: str = MODEL,
    output: Path = typer.Option(..., "-o", "--output", help="The .h5ad file to write."),
    clusters: OptionalClusters = None,
    pcs: OptionalComponents = PCS,
    images: bool = typer.Option(True, help="Store thumbnails for squidpy in uns['spatial']."),
    skip_missing: bool = SKIP_MISSING,
    scale: ScaleLabel = None,
    plan: str | None = PLAN,
) -> None:
    output_file(output)
    found = _analysed(stores, model, clusters, pcs, skip_missing=skip_missing, scale=scale,
                      plan=plan)  # fmt: skip
    ds = found.ds
    obs = {"cluster": found.clusters} if found.clusters is not None else None
    _writer("anndata")(ds, output, obs=obs, images=images)
    out.print(
        f"{len(ds.tiles.slides)} slide(s), {ds.sizes['tile']} tiles -> {output}", highlight=False
    )


@_export("map")
def map_png(
    store: Path = typer.Argument(..., help="An embedded store."),
    model: str = MODEL,
    output: Path = typer.Option(..., "-o", "--output", help="PNG of the PCA colour map."),
    clusters: Annotated[
        int | None,
        Opt(
            "Also write <output>-clusters.png and -gallery.png with k clusters.",
            low=2,
            high=MAX_CLUSTERS,
            none="none",
        ),
    ] = None,
    pcs: OptionalComponents = PCS,
    plan: str | None = PLAN,
) -> None:
    output_file(output)
    found = _analysed([store], model, clusters, pcs, plan=plan)
    written = _writer("map")(found.ds, output, clusters=found.clusters)
    out.print(" ".join(map(str, written)), highlight=False)


@_export("heatmap")
def heatmap(
    store: Path = typer.Argument(..., help="An embedded store."),
    model: str = MODEL,
    column: str = typer.Option(
        "score",
        help="A per-tile column (tissue, roi, qc_<artefact>, roi_class...), clusters, "
        "similarity (with --tile or --at), or with --scores the score column to read.",
    ),
    tile: TileIndex = None,
    at: str | None = typer.Option(None, help="similarity: to the tile under level-0 X,Y."),
    k: Clusters = CLUSTERS,
    scores: Path | None = typer.Option(
        None,
        help="Your own scores: Parquet or CSV with 'tile' (or 'x', 'y' level-0 px) and "
        "the score column.",
    ),
    png: Path | None = typer.Option(None, "--png", help="Write the heatmap over the slide."),
    geojson: Path | None = typer.Option(
        None, "--geojson", help="Write QuPath tile objects with the value as a measurement."
    ),
    label: bool = typer.Option(
        False, "--label", help="Write it into the store as an OME-Zarr label image."
    ),
) -> None:
    from tilestore.exports import heatmap_values

    if not (png or geojson or label):
        raise typer.BadParameter("give at least one of --png, --geojson, --label")
    if scores is None and column == "score":
        raise typer.BadParameter(
            "--column: which values? a per-tile column, clusters or similarity; or --scores FILE"
        )
    point = None
    if at is not None:
        try:
            point = tuple(float(v) for v in at.split(","))
        except ValueError:
            point = ()
        if len(point) != 2:
            raise typer.BadParameter(f"--at {at}: two numbers, X,Y in level-0 px")
    output_file(png)
    output_file(geojson)
    found = heatmap_values(store, model, column, k=k, ref=tile, at=point, scores=scores)
    written = _writer("heatmap")(found, png=png, geojson=geojson, label=label)
    out.print(f"{found.values.label}: {len(found.values.rows)} tiles -> " + ", ".join(written),
              highlight=False)  # fmt: skip


@_export("h5")
def h5(
    stores: list[str] = typer.Argument(..., help="Embedded stores, or a quoted glob."),
    model: str = MODEL,
    output: Path = typer.Option(..., "-o", "--output", help="Folder for one <slide>.h5 each."),
    layout: H5Layout = "trident",
    overwrite: bool = typer.Option(False, help="Replace existing files."),
    skip_missing: bool = SKIP_MISSING,
    scale: ScaleLabel = None,
    plan: str | None = PLAN,
) -> None:
    """TRIDENT's slide encoders, CLAM and other MIL code read --layout trident, STAMP
    --layout stamp. The stores are checked as one cohort first (made alike, at one scale),
    every file's place before the first is written; the files are all written or none."""
    output_file(output, folder=True)
    written = _writer("h5")(
        stores,
        model,
        output,
        layout=layout,
        overwrite=overwrite,
        skip_missing=skip_missing,
        scale=scale,
        plan=plan,
    )
    for done in written:
        store = done.store
        note = (
            f"; {done.misplaced} tiles' coords // {done.patch_size_level0} fall outside their "
            "grid cell (a grid of fractional level-0 steps)"
            if done.misplaced
            else ""
        )
        line = f"{store}: {done.tiles} tiles x {done.dim} -> {done.path}{note}"
        out.print(line, highlight=False, soft_wrap=True)


@_export("slides")
def slides(
    stores: list[str] = typer.Argument(..., help="Stores with slide embeddings, or a glob."),
    model: str = MODEL,
    slide_encoder: str = typer.Option(
        ..., "--slide-encoder", "-s", help="The slide encoder (see `tilestore models list`)."
    ),
    output: Path = typer.Option(
        ..., "-o", "--output", help="A .parquet, .csv or .h5ad (AnnData) file."
    ),
    skip_missing: bool = typer.Option(
        False, "--skip-missing", help="Leave out stores without this slide embedding."
    ),
    scale: ScaleLabel = None,
    plan: str | None = PLAN,
) -> None:
    """Columns: slide, store, tiles (how many tile features each vector was made from), then
    the features f0, f1, ... (in .h5ad: X, the rest as obs)."""
    from tilestore.embeddings import open_slide_embeddings
    from tilestore.exports import table_format

    table_format(output)  # a file type it does not write: refused before any store is read
    output_file(output)
    ds = open_slide_embeddings(
        stores, model, slide_encoder, skip_missing=skip_missing, scale=scale, plan=plan
    )
    _writer("slides")(ds, output)
    out.print(f"{ds.sizes['slide']} slide(s) x {ds.sizes['feature']} -> {output}", highlight=False)
