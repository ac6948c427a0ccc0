"""Into the store: `convert` (a slide file, once, into an OME-Zarr store), `open_in_place` (a
TIFF slide read where it is, through a sidecar made the first time), `describe` (what a file
or store holds, and what conversion would do with it) and `reshard` (a store made before
shards rewritten into them); a store bound for a bucket is built here and uploaded
(`BucketStore`). Out of it: `tilestore.exports`.

May import: `tilestore.masks` (a tissue mask made beside a conversion), `tilestore.reading`,
`tilestore.sources`, `tilestore.format`.
"""

from __future__ import annotations

from tilestore.faces import lazy_face

__getattr__, __dir__, __all__ = lazy_face(
    __name__,
    {
        "tilestore.conversion.bucket": ("BucketStore", "check_places", "no_sidecars_there"),
        "tilestore.conversion.converter": (
            "QUALITY",
            "SHARD_CHUNKS",
            "SUBSAMPLING",
            "ConversionReport",
            "check_mpp",
            "convert",
            "converted_store",
            "slides_of",
        ),
        "tilestore.conversion.info": ("describe", "pixel_count"),
        "tilestore.conversion.many": ("Converted", "convert_many", "file_sizes", "slides_at_once"),
        "tilestore.conversion.resharding": ("ReshardReport", "reshard"),
        "tilestore.conversion.sidecar": ("open_in_place",),
    },
)
