"""The store format: OME-Zarr 0.5 metadata (`omezarr`), the chunk codecs (`codecs`, our JPEG
codec registered with zarr), JPEG headers (`jpeg`), chunk integrity (`integrity`: CRC-32C,
safe whole-file reads; `positions`: each chunk's CRC-32C recorded by its place), shards
(`shards`), whole-chunk access (`chunks`), what a store says about itself (`record`) and
what each group in it does (`records`: plans, embeddings, slide vectors, scores, labels), the
store on disk (`store`: open, recognise,
name) and the names of work in progress (`leftovers`).

The bottom floor: imports only `tilestore.errors` and `tilestore.cpus`.
"""

from __future__ import annotations

from tilestore.faces import lazy_face

__getattr__, __dir__, __all__ = lazy_face(
    __name__,
    {
        "tilestore.format.chunks": ("ChannelPick", "ChunkReader"),
        "tilestore.format.codecs": ("JpegCodec", "has_checksums", "jpeg_codecs", "zstd_codecs"),
        "tilestore.format.integrity": ("read_file", "seal", "unseal"),
        "tilestore.format.positions": ("Positions",),
        "tilestore.format.record": ("ATTRS_KEY", "StoreRecord"),
        "tilestore.format.records": (
            "EmbeddingsRecord",
            "GroupRecord",
            "LabelRecord",
            "LearnedRecord",
            "PlanRecord",
            "ScoresRecord",
            "SlideVectorRecord",
            "TileSumsRecord",
            "find_record",
            "holds_record",
            "read_record",
            "write_record",
            "written_record",
        ),
        "tilestore.format.store": (
            "STORE_SUFFIX",
            "open_for_writing",
            "is_store",
            "one_store_each",
            "open_store",
            "software_versions",
            "store_name",
            "tree_size",
            "writing",
            "written_whole",
        ),
    },
)
