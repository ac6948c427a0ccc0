"""The embeddings format: where a model's group lives in a store and what it holds.

``embeddings/<model>`` (plain zarr v3, readable by ``xarray.open_zarr(store,
group="embeddings/<model>")``): ``features`` (tile, feature) float16 or float32, one zarr
chunk per batch, about `tilestore.format.shards.SHARD_TILES` tiles of whole
batches to a shard (one file); 1-D
coordinates on ``tile``: x, y (level-0 pixels of the tile's top-left corner, origin top
left, y down), x_um, y_um (the same in micrometres), grid row and col, tissue and ROI
fractions, roi_class (an index into the group's ``classes``), and where the plan had QC,
qc_<artefact> (each tile's share of it, names in ``qc_classes``), each column one file;
``done`` (batch) flags, sharded alike, written after each shard's features. The group's
``tilestore`` attributes record the model, plan, batch size, settings and whether the
group is ``complete``. `tilestore.embeddings.write` makes groups,
`tilestore.embeddings.read` opens them.
"""

from __future__ import annotations

GROUP = "embeddings"
COORDS = ("x", "y", "x_um", "y_um", "row", "col", "tissue", "roi", "roi_class")
UNITS = {"x": "level-0 pixel", "y": "level-0 pixel", "x_um": "micrometer", "y_um": "micrometer"}
COORDINATES = (
    "x, y: level-0 pixels of each tile's top-left corner, origin at the slide's top-left, "
    "y down; x_um, y_um: the same in micrometres"
)


def group_name(model: str) -> str:
    """The group of a model's embeddings: uni -> embeddings/uni, timm:vit_b -> timm-vit_b."""
    return f"{GROUP}/{model.replace(':', '-').replace('/', '_')}"
