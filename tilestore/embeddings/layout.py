"""The embeddings format: where a model's group lives in a store and what it holds.

``embeddings/<model>/<plan>`` (plain zarr v3, readable by ``xarray.open_zarr(store,
group="embeddings/<model>/<plan>")``): one group per model AND plan, so one model's features
of several plans (a tissue plan's and a ROI plan's) live side by side in one store. A store
made before holds ``embeddings/<model>`` itself as the group of the one plan its record
names (``plan.name``): it is read, resumed and listed as that plan's group, where it is
(`tilestore.embeddings.groups.plan_groups`); another plan's group of that model is made
beside it, at ``embeddings/<model>/<plan>``. Each group: ``features`` (tile, feature)
float16 or float32, one zarr chunk per batch, about `tilestore.format.shards.SHARD_TILES`
tiles of whole batches to a shard (one file); 1-D coordinates on ``tile``: x, y (level-0
pixels of the tile's top-left corner, origin top left, y down), x_um, y_um (the same in
micrometres), grid row and col, tissue and ROI fractions, roi_class (an index into the
group's ``classes``), and where the plan had QC, qc_<artefact> (each tile's share of it,
names in ``qc_classes``), each column one file; ``done`` (batch) flags, sharded alike,
written after each shard's features. The group's ``tilestore`` attributes record the model,
plan, batch size, settings and whether the group is ``complete``.
`tilestore.embeddings.write` makes groups, `tilestore.embeddings.read` opens them.
"""

from __future__ import annotations

from tilestore.plan.options import RESERVED_NAMES

GROUP = "embeddings"
COORDS = ("x", "y", "x_um", "y_um", "row", "col", "tissue", "roi", "roi_class")
UNITS = {"x": "level-0 pixel", "y": "level-0 pixel", "x_um": "micrometer", "y_um": "micrometer"}
COORDINATES = (
    "x, y: level-0 pixels of each tile's top-left corner, origin at the slide's top-left, "
    "y down; x_um, y_um: the same in micrometres"
)


RESERVED = RESERVED_NAMES  # a group's own subgroups: never a plan's name (`PlanOptions`)


def model_folder(model: str) -> str:
    """Where a model's groups are: uni -> embeddings/uni, timm:vit_b -> embeddings/timm-vit_b
    (a store made before: the group of its one plan)."""
    return f"{GROUP}/{model.replace(':', '-').replace('/', '_')}"


def group_name(model: str, plan: str) -> str:
    """The group of a model's embeddings of one plan: embeddings/<model>/<plan>."""
    return f"{model_folder(model)}/{plan}"
