"""Tile embeddings out to the per-slide HDF5 files other pathology tools read.

TRIDENT's layout (`trident.IO.save_h5`, read by its slide encoders and by CLAM's and
STAMP-style MIL code): one ``<slide>.h5`` per slide with datasets

- ``features`` (tile, feature) float32, attributes name, encoder;
- ``coords`` (tile, 2) int64, x and y of each tile's top-left corner in level-0 pixels,
  attributes patch_size (px at the target magnification), patch_size_level0,
  level0_magnification, target_magnification, overlap, level0_width, level0_height, name
  (TRIDENT's), patch_level (CLAM's: 0, the coordinates' level);

plus ``tilestore_*`` attributes on ``coords`` saying where the file came from (store,
model, plan, um/px).

STAMP's layout (``layout="stamp"``): ``feats`` (tile, feature) float32 and ``coords`` (tile,
2) the tiles' top-left corners in micrometres, with the file's attributes unit "um",
tile_size_um, tile_size_px, feat_type "tile" and extractor (the model), as STAMP's
``get_coords`` reads them. Magnifications are 10 / um-per-px rounded (0.25 um/px: 40x), as the
tools take them; patch_size_level0 is the grid's step in level-0 pixels, so
``coords // patch_size_level0`` is each tile's grid cell (what TITAN and Prov-GigaPath
read); where rounding makes that untrue for some tiles, `H5Export.misplaced` counts them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import numpy as np

from tilestore.embeddings.recipe import ScaleLabel
from tilestore.errors import OutputError, StoreError
from tilestore.exports.files import Exported
from tilestore.exports.options import H5Layout, Model, Overwrite, PlanName, SkipMissing, Stores
from tilestore.options import Opt, checked, is_url, named

if TYPE_CHECKING:  # h5py and the embeddings' readers load when a file is written
    import h5py

    from tilestore.embeddings.slides import TileFeatures


@dataclass(frozen=True)
class H5Export:
    """One slide written: where, from which store, how many tiles, and how many tiles'
    coordinates do not fall in their own grid cell when divided by patch_size_level0 (0 on
    whole-pixel grids)."""

    path: Path
    store: str
    tiles: int
    dim: int
    patch_size_level0: int
    misplaced: int


def magnification(mpp: float) -> int | float:
    """The nominal objective magnification of a pixel size, 10 / mpp: a whole number from
    10x up (0.2456 um/px: 41, 0.499: 20), as TRIDENT writes it; below, two significant
    digits (4 um/px: 2.5, a 28.97 um/px DICOM: 0.35), never 0: a stored pixel size is at
    most 100 um/px (`MPP_RANGE`), 0.1x."""
    value = 10.0 / mpp
    return round(value) if value >= 9.5 else float(f"{value:.2g}")


@checked
def to_h5(
    store: str | os.PathLike,
    model: str,
    folder: str | os.PathLike,
    *,
    layout: H5Layout = "trident",
    overwrite: bool = False,
    plan: str | None = None,
) -> H5Export:
    """Write a store's tile embeddings of `model` as ``<folder>/<slide>.h5`` in TRIDENT's
    (and CLAM's) layout or STAMP's. The file is written under a hidden name and renamed
    into place whole; an existing file is kept unless overwrite. plan: the plan whose
    embeddings are read, where the store holds the model's of several."""
    import h5py

    from tilestore.embeddings.slides import read_tile_features

    tiles = read_tile_features(store, model, plan)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{tiles.name}.h5"
    if target.exists() and not overwrite:
        raise OutputError(f"{target}: exists; pass overwrite=True to replace it")
    attrs, misplaced = coords_attributes(tiles)
    partial = folder / f".{target.name}.partial.{os.getpid()}"
    try:
        with h5py.File(partial, "w") as f:
            (_trident if layout == "trident" else _stamp)(f, tiles, attrs)
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
    return H5Export(
        target,
        str(store),
        tiles.tiles,
        int(tiles.features.shape[1]),
        attrs["patch_size_level0"],
        misplaced,
    )


@checked
def cohort_to_h5(
    stores,
    model: str,
    folder: str | os.PathLike,
    *,
    layout: H5Layout = "trident",
    overwrite: bool = False,
    skip_missing: bool = False,
    scale: ScaleLabel = None,
    plan: str | None = None,
) -> list[H5Export]:
    """`to_h5` for each of a cohort's stores (names, a list, or glob patterns), its files
    made to be read together: the stores' features are checked as one population first
    (`tilestore.embeddings.recipe.combine`: made alike and at one scale, or the `scale`
    named), stores without finished embeddings left out with a warning where a glob found
    them or skip_missing (as every export does: `read_each`), and every file checked free
    (or overwrite) before the first is written; a store whose features turn out damaged as
    they are read stops the export, and the files this call made are removed.

    Parameters
    ----------
    stores : str, path or list of them
        Stores, or glob patterns.
    model : str
        The model whose tile embeddings are written.
    folder : str or path
        Where ``<slide>.h5`` files go (made where missing).
    layout : {"trident", "stamp"}
        TRIDENT's and CLAM's datasets and attributes, or STAMP's.
    overwrite : bool
        Replace existing files (else OutputError before the first is written).
    skip_missing, scale, plan
        As `tilestore.open_embeddings` takes them.

    Returns
    -------
    list of H5Export
        One per file written: its path, store, tiles, width, the grid's step and the tiles
        whose coordinates fall outside their grid cell.
    """
    from tilestore.embeddings.groups import (
        open_finished,
        read_each,
        refuse_shared_names,
        slide_name,
    )
    from tilestore.embeddings.recipe import combine, recipe

    found = read_each(
        stores,
        lambda store: (store, recipe(open_finished(store, model, plan).meta)),
        skip_missing,
        f"no embeddings of {model!r}",
    )
    kept = [
        found[i][0]
        for i in combine([(str(s), r) for s, r in found], f"{model!r} embeddings", scale)
    ]
    names = [slide_name(store) for store in kept]
    refuse_shared_names(names)
    taken = [
        Path(folder) / f"{name}.h5" for name in names if (Path(folder) / f"{name}.h5").exists()
    ]
    if taken and not overwrite:
        raise OutputError(f"{taken[0]}: exists; pass overwrite=True to replace it")
    written: list[H5Export] = []
    try:
        for store in kept:
            written.append(
                to_h5(store, model, folder, layout=layout, overwrite=overwrite, plan=plan)
            )
    except BaseException:  # a store's features found damaged as they are read: the cohort's
        for done in written:  # files are all or none, never a part that looks whole
            if done.path not in taken:
                done.path.unlink(missing_ok=True)
        raise
    return written


@checked
def export_h5(
    stores: Stores,
    *,
    model: Model,
    output: Annotated[Path, Opt("Folder for one <slide>.h5 each.", short="o", writes="folder")],
    layout: H5Layout = "trident",
    overwrite: Overwrite = False,
    skip_missing: SkipMissing = False,
    scale: ScaleLabel = None,
    plan: PlanName = None,
) -> Exported:
    """`tilestore export h5`: `cohort_to_h5`, and a line per file written.

    TRIDENT's slide encoders, CLAM and other MIL code read --layout trident, STAMP --layout
    stamp. The stores are checked as one cohort first (made alike, at one scale), every
    file's place before the first is written; the files are all written or none.
    """
    written = cohort_to_h5(
        stores,
        model,
        output,
        layout=layout,
        overwrite=overwrite,
        skip_missing=skip_missing,
        scale=scale,
        plan=plan,
    )
    lines = []
    for done in written:
        note = (
            f"; {done.misplaced} tiles' coords // {done.patch_size_level0} fall outside their "
            "grid cell (a grid of fractional level-0 steps)"
            if done.misplaced
            else ""
        )
        lines.append(f"{done.store}: {done.tiles} tiles x {done.dim} -> {done.path}{note}")
    return Exported(tuple(lines))


def _trident(f: h5py.File, tiles: TileFeatures, attrs: dict) -> None:
    features = f.create_dataset("features", data=tiles.features.astype(np.float32, copy=False))
    features.attrs.update({"name": tiles.name, "encoder": tiles.model})
    coords = f.create_dataset("coords", data=np.stack([tiles.x, tiles.y], axis=1))
    coords.attrs.update(attrs)


def _stamp(f: h5py.File, tiles: TileFeatures, attrs: dict) -> None:
    mpp_x, mpp_y = tiles.slide_mpp
    f.create_dataset("feats", data=tiles.features.astype(np.float32, copy=False))
    f.create_dataset("coords", data=np.stack([tiles.x * mpp_x, tiles.y * mpp_y], axis=1))
    f.attrs.update(
        {
            "unit": "um",
            "tile_size_um": float(tiles.footprint0[1] * mpp_x),
            "tile_size_px": int(tiles.tile_size),
            "feat_type": "tile",
            "extractor": tiles.model,
            **{k: v for k, v in attrs.items() if k.startswith("tilestore_")},
        }
    )


def coords_attributes(tiles: TileFeatures) -> tuple[dict, int]:
    """TRIDENT's and CLAM's attributes of ``coords`` for a slide's tiles, and how many tiles
    ``coords // patch_size_level0`` would put in another grid cell than their own."""
    if tiles.slide_mpp is None or not tiles.mpp:
        raise StoreError(
            f"{tiles.store}: the pixel size is unknown; TRIDENT's layout needs magnifications "
            "(convert the slide again with mpp=<um/px>)"
        )
    step = round(tiles.stride0[1])
    misplaced = 0
    if step > 0 and tiles.tiles:
        # each tile's grid column and row, as a reader dividing by patch_size_level0 finds them
        cols = np.rint(tiles.x / tiles.stride0[1]).astype(np.int64)
        rows = np.rint(tiles.y / tiles.stride0[0]).astype(np.int64)
        misplaced = int(np.sum((tiles.x // step != cols) | (tiles.y // step != rows)))
    overlap = round(
        (tiles.footprint0[1] - tiles.stride0[1]) * tiles.tile_size / tiles.footprint0[1]
    )
    attrs = {
        "patch_size": int(tiles.tile_size),
        "patch_size_level0": int(step),
        "level0_magnification": magnification(tiles.slide_mpp[0]),
        "target_magnification": magnification(tiles.mpp),
        "overlap": int(overlap),
        "level0_width": int(tiles.slide_shape[1]),
        "level0_height": int(tiles.slide_shape[0]),
        "name": tiles.name,
        "patch_level": 0,
        "tilestore_store": _where(tiles.store),
        "tilestore_model": tiles.model,
        "tilestore_plan": tiles.plan,
        "tilestore_mpp": float(tiles.mpp),
        "tilestore_footprint_level0": float(tiles.footprint0[1]),
    }
    return attrs, misplaced


def _where(store: str) -> str:
    """A store as a file's attribute names it: its absolute path, or its URL as shown."""
    return named(store) if is_url(store) else str(Path(store).resolve())
