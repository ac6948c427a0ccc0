"""Slide embeddings in stores: the tile features a slide encoder reads, and the one vector
per slide it writes back, at ``embeddings/<tile model>/slides/<encoder>``.

A slide vector is only as good as the tile features it was computed from, so each records
the tile group it read (its plan, tile count and the time it was finished); a reader
refuses a vector whose tile group was embedded again since (`StaleSlideEmbedding`), rather
than hand back features of tiles that are no longer there.

>>> tiles = read_tile_features("a.ome.zarr", "conch-v1.5")      # what an encoder reads
>>> write_slide_vector(tiles, "titan", vector, record)          # what it writes
>>> ds = open_slide_embeddings(["a.ome.zarr", "b.ome.zarr"], "conch-v1.5", "titan")
>>> ds.features                                                 # (slide, feature)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tilestore.embeddings.groups import (
    DamagedEmbeddings,
    NotEmbedded,
    StoreLike,
    all_finite,
    check_rows,
    check_shapes,
    embed_again,
    find_group,
    open_finished,
    open_group,
    read_each,
    refuse_shared_names,
    slide_name,
)
from tilestore.embeddings.recipe import Recipe, ScaleLabel, combine, recipe, scale_of, with_facts
from tilestore.errors import EmbeddingError, SlideEmbeddingExists, StaleSlideEmbedding, StoreError
from tilestore.format import leftovers
from tilestore.format.codecs import zstd_codecs
from tilestore.format.records import (
    EmbeddingsRecord,
    SlideVectorRecord,
    read_record,
    write_record,
)
from tilestore.format.store import damage_as_store_error, open_for_writing
from tilestore.options import checked, is_url, named
from tilestore.urls import only_read

SLIDES = "slides"  # the subgroup of a tile model's group holding its slide embeddings
VECTOR = "embedding"  # the array of one slide embedding: (feature,)
# a slide vector's record's facts compared where vectors of several stores meet (`combine`)
ENCODER_FACTS = ("weights", "revision", "precision", "dim")


@dataclass(frozen=True)
class TileFeatures:
    """One slide's finished tile embeddings, in memory: what a slide encoder reads.

    x, y: level-0 pixels of each tile's top-left corner; row, col: its cell in the plan's
    grid (from the slide's top-left); footprint0 and stride0: a tile's
    side and the step between tiles, in level-0 pixels (y, x); mpp: the plan's um/px as
    read; tile_size: the tile's side in pixels at that mpp (before the model's transform);
    slide_mpp: level-0 um/px (x, y); slide_shape: level-0 (height, width)."""

    store: str
    name: str
    model: str
    features: np.ndarray
    x: np.ndarray
    y: np.ndarray
    row: np.ndarray
    col: np.ndarray
    footprint0: tuple[float, float]
    stride0: tuple[float, float]
    mpp: float | None
    tile_size: int
    plan: str
    finished: str
    recipe: Recipe
    model_info: dict[str, Any]
    slide_mpp: tuple[float, float] | None
    slide_shape: tuple[int, int]
    path: str = ""  # the group's path in the store (`tilestore.embeddings.layout`)

    @property
    def tiles(self) -> int:
        return int(self.features.shape[0])

    def source(self) -> dict[str, Any]:
        """What a slide embedding records of the tile features it read."""
        return {
            "model": self.model,
            "plan": self.plan,
            "tiles": self.tiles,
            "finished": self.finished,
            "mpp": self.mpp,
            "tile_size": self.tile_size,
            "footprint0": list(self.footprint0),
        }


def slide_group_name(tiles_path: str, encoder: str) -> str:
    """<tile group>/slides/<encoder>: beside the tile features it was computed from."""
    return f"{tiles_path}/{SLIDES}/{encoder.replace(':', '-').replace('/', '_')}"


def read_tile_features(store: StoreLike, model: str, plan: str | None = None) -> TileFeatures:
    """Return a store's finished tile embeddings of `model` (of `plan`: None, the model's
    only plan's), features and coordinates read whole (a slide's features are at most a few
    hundred MB); NotEmbedded where the group is absent or unfinished, StoreError where it is
    damaged (DamagedEmbeddings where its shapes disagree or its features are not finite)."""
    from tilestore.reading.opening import open_slide

    found = open_finished(store, model, plan)
    path, meta = found.path, found.meta
    with damage_as_store_error(store, path, found.fix):
        features, x, y, row, col = (
            found.arrays[k][:] for k in ("features", "x", "y", "row", "col")
        )
        slide = open_slide(store)
    check_rows(features, f"{store}: {path}/features", found.fix)
    grid = meta.get("grid") or {}
    down = grid.get("downsample", (1.0, 1.0))
    read = grid.get("read", meta.get("read_px"))
    step = grid.get("read_stride") or read
    scale = scale_of(meta)
    if scale is None:
        raise DamagedEmbeddings(
            f"{store}: {path}: no tile size recorded (no grid): {embed_again(path)}"
        )
    return TileFeatures(
        store=str(store),
        name=slide_name(store),
        model=model,
        path=path,
        features=features,
        x=x.astype(np.int64),
        y=y.astype(np.int64),
        row=row.astype(np.int64),
        col=col.astype(np.int64),
        footprint0=(read * down[0], read * down[1]),
        stride0=(step * down[0], step * down[1]),
        mpp=scale.mpp,  # the group's scale, as every reader takes it (`scale_of`)
        tile_size=scale.tile,
        plan=str(found.record.plan_name),
        finished=found.record.finished,
        recipe=recipe(meta),
        model_info=dict(found.record.model or {}),
        slide_mpp=slide.mpp,
        slide_shape=(int(slide.shape[1]), int(slide.shape[2])),
    )


def write_slide_vector(
    tiles: TileFeatures,
    encoder: str,
    vector: np.ndarray,
    record: dict[str, Any],
    *,
    overwrite: bool = False,
) -> str:
    """Write one slide embedding beside the tile features it was computed from; return its
    group's path in the store.

    It is made in a hidden group and renamed into place whole, so a reader sees the old
    vector or the new one, never half of one; SlideEmbeddingExists where one is there and
    not overwrite; StaleSlideEmbedding where the tile group changed while it computed;
    EmbeddingError, nothing written, where the vector holds a NaN or an infinity. A store
    read through a URL is refused (StoreError): one in object storage is only read."""
    if is_url(tiles.store):
        raise only_read(named(tiles.store), "a slide embedding")
    store = Path(tiles.store)
    path = slide_group_name(tiles.path, encoder)
    values = np.asarray(vector, dtype=np.float32).reshape(-1)
    if not all_finite(values):
        raise EmbeddingError(
            f"{tiles.store}: {encoder} made a slide embedding with NaN or infinite values "
            f"from {tiles.tiles} finite tile features of {tiles.model}; {path} is not written"
        )
    target = store / path
    if (
        target.exists()
        and not overwrite
        and has_current_vector(tiles.store, tiles.model, encoder, tiles.plan)
    ):
        raise SlideEmbeddingExists(
            f"{tiles.name}: {path} exists; pass overwrite=True to compute it again"
        )
    current = read_record(open_group(tiles.store, tiles.path), EmbeddingsRecord, tiles.path)
    if (current or EmbeddingsRecord()).finished != tiles.finished:
        raise StaleSlideEmbedding(
            f"{tiles.name}: {tiles.path} was embedded again while {encoder} computed; run it again"
        )
    root = open_for_writing(store)
    root.require_group(f"{tiles.path}/{SLIDES}")
    leftovers.clear(target)  # what killed writes of this vector left (hidden, never read)
    with leftovers.built_beside(target, "cannot write the slide embedding") as hidden:
        group = root.create_group(str(hidden.relative_to(store)))
        array = group.create_array(
            VECTOR, shape=values.shape, dtype="float32", **zstd_codecs(level=3)
        )  # its CRC-32C: `tilestore verify` checks it as every other array
        array[:] = values
        made = {**record, "tiles": tiles.source(), "dim": int(values.size)}
        write_record(group, SlideVectorRecord.make(f"{tiles.store}: {path}", **made))
    return path


def has_current_vector(store: StoreLike, model: str, encoder: str, plan: str | None = None) -> bool:
    """Whether the store holds this encoder's slide vector, computed from the tile features
    it holds now (a damaged or stale one is not current: it is computed again)."""
    try:
        read_slide_vector(store, model, encoder, plan)
    except StoreError:  # absent, stale or damaged
        return False
    return True


def read_slide_vector(
    store: StoreLike, model: str, encoder: str, plan: str | None = None
) -> dict[str, Any]:
    """One store's slide embedding: {"name", "store", "vector", "record"}; NotEmbedded where
    there is none, StaleSlideEmbedding where its tile features were embedded again since,
    DamagedEmbeddings where it is not the width recorded or not finite, or where the tile
    group it was computed from is damaged (`check_shapes`). plan: the tile group's (None:
    the model's only plan's)."""
    try:
        tiles_path = find_group(store, model, plan)
        path = slide_group_name(tiles_path, encoder)
        group = open_group(store, path)
    except KeyError as exc:
        raise NotEmbedded(
            f"{store}: no {exc.args[0]}/{SLIDES}/{encoder}; run `tilestore embed "
            f"--slide-encoder {encoder}` on it first"
        ) from None
    fix = f"compute it again (tilestore embed --slide-encoder {encoder} --overwrite)"
    with damage_as_store_error(store, path, fix):
        record = read_record(group, SlideVectorRecord, f"{store}: {path}", fix)
        if record is None:
            raise KeyError(f"{path}'s record")
        vector = group[VECTOR][:]
        tile_group = open_group(store, tiles_path)
        tiles_meta = read_record(tile_group, EmbeddingsRecord, f"{store}: {tiles_path}")
        tiles_meta = tiles_meta or EmbeddingsRecord()
        if vector.shape != (vector.size if record.dim is None else record.dim,):
            raise DamagedEmbeddings(
                f"{store}: {path}/{VECTOR} has shape {vector.shape} where its record says "
                f"({record.dim},): it is damaged; {fix}"
            )
    check_rows(vector.reshape(-1, 1), f"{store}: {path}/{VECTOR}", fix, unit="value")
    if tiles_meta.finished != record.tiles["finished"]:
        raise StaleSlideEmbedding(
            f"{store}: {path} was computed from tile features replaced since (embedded "
            f"{record.tiles['finished']}, now {tiles_meta.get('finished')}); run "
            f"`tilestore embed --slide-encoder {encoder} --overwrite` on it"
        )
    if record.guide:
        guide_current(store, record.guide, path, encoder)
    with damage_as_store_error(store, tiles_path, embed_again(tiles_path)):
        check_shapes(store, tiles_path, tiles_meta.to_attrs(), dict(tile_group.arrays()))
    return {
        "name": slide_name(store),
        "store": str(store),
        "vector": vector,
        "record": record.to_attrs(),
        "recipe": recipe(tiles_meta.to_attrs()),
    }


def guide_current(store: StoreLike, guide: Mapping[str, Any], path: str, encoder: str) -> None:
    """StaleSlideEmbedding where the tile group that guided a slide vector (EAGLE's
    CTransPath features choosing its tiles) was embedded again or removed since."""
    try:
        where = find_group(store, guide.get("model", ""), guide.get("plan"))
        meta = read_record(open_group(store, where), EmbeddingsRecord, f"{store}: {where}")
    except KeyError:
        meta = None
    now = (meta or EmbeddingsRecord()).finished
    if now != guide.get("finished"):
        raise StaleSlideEmbedding(
            f"{store}: {path} was computed with {guide.get('model')} tile features "
            f"(embedded {guide.get('finished')}) {'replaced' if meta else 'removed'} since; run "
            f"`tilestore embed --slide-encoder {encoder} --overwrite` on it"
        )


@checked
def open_slide_embeddings(
    stores: StoreLike | Sequence[StoreLike],
    model: str,
    encoder: str,
    *,
    skip_missing: bool = False,
    scale: ScaleLabel = None,
    plan: str | None = None,
):
    """Return a cohort's slide embeddings as an xarray Dataset on (slide, feature).

    ``features`` (slide, feature) float32; coordinates ``slide`` (name), ``store`` and
    ``n_tiles`` (how many tile features each vector was computed from). The stores must agree
    on the encoder's weights and on the tile features they read, made alike and at one scale
    (`tilestore.embeddings.recipe.combine`, as `open_embeddings`; scale: the one to keep of
    several). skip_missing (and stores a glob pattern finds): leave out stores without one."""
    import xarray as xr

    found = read_each(
        stores,
        lambda store: read_slide_vector(store, model, encoder, plan),
        skip_missing,
        f"no {encoder!r} slide embeddings of {model!r}",
    )
    kept = combine(
        [(f["store"], _with_encoder(f["recipe"], f["record"])) for f in found],
        f"{encoder!r} slide embeddings",
        scale,
    )
    found = [found[i] for i in kept]
    names = [f["name"] for f in found]
    refuse_shared_names(names)
    first = found[0]
    return xr.Dataset(
        {"features": (("slide", "feature"), np.stack([f["vector"] for f in found]))},
        coords={
            "slide": names,
            "store": ("slide", [f["store"] for f in found]),
            "n_tiles": ("slide", [f["record"]["tiles"]["tiles"] for f in found]),
        },
        attrs={"model": model, "slide_encoder": encoder, "encoder_info": first["record"]},
    )


def _with_encoder(tiles: Recipe, record: dict[str, Any]) -> Recipe:
    """The recipe of a slide vector: its tile features' and its encoder's weights."""
    return with_facts(tiles, "encoder", {k: record.get(k) for k in ENCODER_FACTS})
