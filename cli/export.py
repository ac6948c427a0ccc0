"""`tilestore export ...`: a store as OME-TIFF; embeddings out to QuPath, AnnData, PNG maps."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from tilestore.analysis import (
    MAX_CLUSTERS,
    Clusters,
    OptionalClusters,
    OptionalComponents,
)
from tilestore.cli.console import output_file
from tilestore.cli.flags import From, with_flags
from tilestore.conversion import to_ome_tiff
from tilestore.embeddings import H5Layout, ScaleLabel
from tilestore.options import Opt
from tilestore.view import TileIndex

export_app = typer.Typer(
    no_args_is_help=True,
    help="A store as pyramidal OME-TIFF; embeddings as QuPath GeoJSON, AnnData .h5ad, PNG maps.",
)
out = Console()

MODEL = typer.Option(..., "--model", "-m", help="The model the store was embedded with.")
PCS = 5  # principal components: QuPath's measurements, the k-means space


SKIP_MISSING = typer.Option(
    False,
    "--skip-missing",
    help="Leave out, with a warning, stores without this model's finished embeddings "
    "(stores a quoted glob finds are always left out so).",
)


def _open(stores: list[str], model: str, skip_missing: bool = False, scale: str | None = None):
    import tilestore

    return tilestore.open_embeddings(stores, model, skip_missing=skip_missing, scale=scale)


def _clusters(ds, k: int | None, pcs: int | None):
    return ds.tiles.kmeans(k, pcs=pcs) if k else None


@export_app.command("ome-tiff")
@with_flags
def ome_tiff(
    store: Path = typer.Argument(..., help="A store made by `tilestore convert`."),
    output: Path = typer.Option(..., "-o", "--output", help="The .ome.tiff to write."),
    options: dict = From(to_ome_tiff, only=("compression",)),
    labels: bool = typer.Option(False, help="Also write the label images (tissue)."),
    overwrite: bool = typer.Option(False, help="Replace an existing file."),
) -> None:
    """A tiled, pyramidal OME-TIFF (SubIFDs) for QuPath, OMERO and Bio-Formats."""
    output_file(output)
    result = to_ome_tiff(store, output, labels=labels, overwrite=overwrite, **options)
    for index, level in enumerate(result.levels):
        _, h, w = level["shape"]
        out.print(f"level {index}: {w}x{h}, {level['tiles']} tiles, {level['how']}")
    if result.labels:
        out.print(f"labels: {', '.join(result.labels)}")
    out.print(
        f"{result.path}: {result.bytes / 2**20:.1f} MB in {result.seconds:.1f} s", highlight=False
    )


@export_app.command("qupath")
@with_flags
def qupath(
    store: Path = typer.Argument(..., help="An embedded store."),
    model: str = MODEL,
    clusters: OptionalClusters = None,
    pcs: OptionalComponents = PCS,
    output: Path | None = typer.Option(
        None, "-o", "--output", help="GeoJSON file (default: <slide>.<model>.geojson here)."
    ),
) -> None:
    """Tiles as QuPath tile objects: classified by cluster, PCs as measurements.

    In QuPath: File > Import objects from file, over the ORIGINAL slide (same pixels).
    """
    from tilestore.analysis import to_qupath
    from tilestore.embeddings import group_name

    output_file(output)
    ds = _open([str(store)], model)
    name = ds.tiles.slides[0]
    target = output or Path(f"{name}.{group_name(model).split('/')[-1]}.geojson")
    to_qupath(
        ds,
        target,
        clusters=_clusters(ds, clusters, pcs),
        measurements=ds.tiles.pca(pcs) if pcs else None,
    )
    out.print(f"{name}: {ds.sizes['tile']} tiles -> {target}", highlight=False)


@export_app.command("anndata")
@with_flags
def anndata(
    stores: list[str] = typer.Argument(..., help="Embedded stores, or a quoted glob."),
    model: str = MODEL,
    output: Path = typer.Option(..., "-o", "--output", help="The .h5ad file to write."),
    clusters: OptionalClusters = None,
    pcs: OptionalComponents = PCS,
    images: bool = typer.Option(True, help="Store thumbnails for squidpy in uns['spatial']."),
    skip_missing: bool = SKIP_MISSING,
    scale: ScaleLabel = None,
) -> None:
    """Tiles as an AnnData .h5ad (X = features, obsm['spatial'] = centres) for scanpy/squidpy."""
    from tilestore.analysis import to_anndata

    output_file(output)
    ds = _open(stores, model, skip_missing, scale)
    found = _clusters(ds, clusters, pcs)
    to_anndata(ds, output, obs={"cluster": found} if found is not None else None, images=images)
    out.print(
        f"{len(ds.tiles.slides)} slide(s), {ds.sizes['tile']} tiles -> {output}", highlight=False
    )


@export_app.command("map")
@with_flags
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
) -> None:
    """PNG maps over the slide thumbnail: first three PCs as colour, optionally clusters."""
    from tilestore.analysis import plot_gallery, plot_map

    output_file(output)
    ds = _open([str(store)], model)
    plot_map(ds, ds.tiles.rgb_map(), path=output, title=f"{ds.tiles.slides[0]}: PC1-3 as RGB")
    written = [output]
    if clusters:
        found = _clusters(ds, clusters, pcs)
        stem = output.with_suffix("")
        for kind, plot in (("clusters", plot_map), ("gallery", plot_gallery)):
            target = Path(f"{stem}-{kind}.png")
            plot(ds, found, path=target)
            written.append(target)
    out.print(" ".join(map(str, written)), highlight=False)


@export_app.command("heatmap")
@with_flags
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
    k: Clusters = 6,
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
    """A heatmap of per-tile values for other tools: PNG, QuPath GeoJSON, OME-Zarr label."""
    from tilestore.view import heatmap_values, write_geojson, write_labels, write_png

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
    written = []
    if png:
        written.append(str(write_png(found, png)))
    if geojson:
        written.append(str(write_geojson(found, geojson)))
    if label:
        written.append(f"{store}/labels/{write_labels(found)}")
    out.print(f"{found.values.label}: {len(found.values.rows)} tiles -> " + ", ".join(written),
              highlight=False)  # fmt: skip


@export_app.command("h5")
@with_flags
def h5(
    stores: list[str] = typer.Argument(..., help="Embedded stores, or a quoted glob."),
    model: str = MODEL,
    output: Path = typer.Option(..., "-o", "--output", help="Folder for one <slide>.h5 each."),
    layout: H5Layout = "trident",
    overwrite: bool = typer.Option(False, help="Replace existing files."),
    skip_missing: bool = SKIP_MISSING,
    scale: ScaleLabel = None,
) -> None:
    """Tile features as per-slide HDF5 files other tools read: TRIDENT's slide encoders,
    CLAM and other MIL code (--layout trident), STAMP (--layout stamp). The stores are
    checked as one cohort first (made alike, at one scale), every file before the first."""
    from tilestore.embeddings import cohort_to_h5

    output_file(output, folder=True)
    written = cohort_to_h5(
        stores,
        model,
        output,
        layout=layout,
        overwrite=overwrite,
        skip_missing=skip_missing,
        scale=scale,
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


@export_app.command("slides")
@with_flags
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
) -> None:
    """A cohort's slide embeddings as one table: a row per slide (slide, store, tiles, then
    the features), for classifiers, survival models and retrieval."""
    from tilestore.embeddings import open_slide_embeddings, slide_table

    suffix = output.suffix.lower()
    if suffix not in (".parquet", ".csv", ".h5ad"):
        raise typer.BadParameter(f"{output}: write a .parquet, .csv or .h5ad file")
    output_file(output)
    ds = open_slide_embeddings(stores, model, slide_encoder, skip_missing=skip_missing, scale=scale)
    if suffix == ".h5ad":
        import anndata

        table = slide_table(ds, features=False)
        adata = anndata.AnnData(
            X=ds.features.values,
            obs=table.set_index("slide"),
            uns={"slide_encoder": slide_encoder, "model": model},
        )
        adata.write_h5ad(output)
    elif suffix == ".csv":
        slide_table(ds).to_csv(output, index=False)
    else:
        slide_table(ds).to_parquet(output, index=False)
    out.print(f"{ds.sizes['slide']} slide(s) x {ds.sizes['feature']} -> {output}", highlight=False)
