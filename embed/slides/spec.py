"""What a slide encoder is (`SlideSpec`: facts from its model card and its authors' code),
and the check that a store's tile features are what it was trained on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import numpy as np

from tilestore.embeddings.slides import TileFeatures
from tilestore.options import Opt

MPP_TOLERANCE = 0.1  # a plan's um/px this close (relative) to the encoder's reads as the same

# The precision a slide encoder (and a patient model) computes in.
SlidePrecision = Annotated[
    Literal["auto", "fp32", "bf16", "fp16"],
    Opt("auto (the authors' precision on CUDA, fp32 on the CPU), fp32, bf16 or fp16."),
]

# How an encoder uses where the tiles are (`SlideSpec.coords`).
COORDS = {
    "none": "a bag of tiles: where they are does not matter",
    "grid": "each tile's cell in a grid of touching tiles (stride = tile): positions or "
    "distances between cells",
}


@dataclass(frozen=True)
class SlideSpec:
    """Facts about one slide encoder.

    tile_model: the registered tile encoder whose features it reads (None: any, as pooling);
    mpp and tile: the resolution (um/px) and tile side (px at it) of those tiles (None: any);
    coords: a key of COORDS; output_dim: None for the tile features' own width (pooling);
    arch: the builder (`tilestore.embed.slides.nets.BUILDERS`) and kwargs its settings;
    source: "hf-hub" (repo, weights_file), "file" (the user downloads weights_file from
    `card` and names it) or "none" (no weights); precision: what the authors run it in;
    patients: its module also makes a patient's vector of that patient's slide vectors
    (`tilestore.embed.slides.patients`); guide: a second registered tile encoder whose
    features of the same plan's tiles the module reads too (EAGLE: CHIEF's CTransPath
    choosing which tiles' Virchow2 features are averaged), `guide_refusal` checks them."""

    name: str
    tile_model: str | None
    mpp: float | None
    tile: int | None
    coords: str
    output_dim: int | None
    arch: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    source: str = "hf-hub"
    repo: str = ""
    weights_file: str | None = None
    gated: bool = False
    licence: str = ""
    precision: str = "fp32"
    card: str = ""
    reference: str = ""  # what `bench/slide_encoders.py` checks ours against
    note: str = ""
    patients: bool = False
    guide: str | None = None

    def __post_init__(self) -> None:
        if self.coords not in COORDS:
            raise ValueError(f"{self.name}: coords {self.coords!r} is not one of {list(COORDS)}")

    def tile_models(self) -> tuple[str, ...]:
        """The tile models whose features it reads: its own; with random weights (a
        benchmark), also that model with random weights."""
        if self.tile_model is None:
            return ()
        if self.source == "random":
            return (self.tile_model, f"random:{self.tile_model}")
        return (self.tile_model,)

    def refusal(self, tiles: TileFeatures) -> str | None:
        """Why these tile features are not what this encoder reads (one line), or None."""
        where = f"{tiles.name}: {self.name}"
        if self.tile_model and tiles.model not in self.tile_models():
            return (
                f"{where} reads {self.tile_model} tile features, not {tiles.model}; embed "
                f"with --model {self.tile_model}"
            )
        width = tiles.features.shape[1]
        expected = self.kwargs.get("in_dim")
        if expected and width != expected:
            return f"{where} reads {expected}-d tile features, these are {width}-d"
        if self.mpp is not None and (
            not tiles.mpp or abs(tiles.mpp - self.mpp) > MPP_TOLERANCE * self.mpp
        ):
            got = f"{tiles.mpp:g} um/px" if tiles.mpp else "an unknown um/px"
            return (
                f"{where} reads tiles at {self.mpp:g} um/px, these are at {got} (plan "
                f"{tiles.plan}); embed with --mpp {self.mpp:g} --tile {self.tile}"
            )
        if self.tile is not None and tiles.tile_size != self.tile:
            return (
                f"{where} reads {self.tile} px tiles, these are {tiles.tile_size} px (plan "
                f"{tiles.plan}); embed with --mpp {self.mpp:g} --tile {self.tile}"
            )
        if self.coords == "grid" and abs(tiles.stride0[1] - tiles.footprint0[1]) > 0.5:
            return (
                f"{where} places tiles on a grid of touching tiles; this plan's tiles step "
                f"{tiles.stride0[1]:g} px for a {tiles.footprint0[1]:g} px tile (plan "
                f"{tiles.plan}): plan without --stride"
            )
        cells = self.kwargs.get("grid_size")
        if cells and tiles.tiles and max(tiles.col.max(), tiles.row.max()) >= cells:
            return (
                f"{where} places tiles on a {cells} x {cells} grid; this slide's reach cell "
                f"{max(tiles.col.max(), tiles.row.max())} (a slide over "
                f"{cells * tiles.footprint0[1] * (tiles.slide_mpp or (0, 0))[0] / 1000:g} mm)"
            )
        if tiles.tiles == 0:
            return f"{where}: the plan {tiles.plan} has no tiles"
        return None

    def guide_refusal(self, tiles: TileFeatures, guide: TileFeatures) -> str | None:
        """Why `guide` is not the guide model's features of `tiles`' own tiles (one line), or
        None: its model, its width, and the same tiles in the same order."""
        where = f"{tiles.name}: {self.name}"
        if guide.model != self.guide:  # read under this name, random weights or not
            return f"{where} is guided by {self.guide} tile features, not {guide.model}"
        width, got = self.kwargs.get("guide_dim"), guide.features.shape[1]
        if width and got != width:
            return f"{where} reads {width}-d {self.guide} features, these are {got}-d"
        same = (
            guide.tiles == tiles.tiles
            and np.array_equal(guide.x, tiles.x)
            and np.array_equal(guide.y, tiles.y)
            and guide.footprint0 == tiles.footprint0
        )
        if not same:
            return (
                f"{where}: the {guide.model} features of plan {guide.plan} are not of the "
                f"{tiles.tiles:,} tiles of {tiles.model}'s (plan {tiles.plan}); embed both "
                "models on one plan"
            )
        return None
