"""Reading a store: `open_slide` opens a store (converted, or a slide's in-place sidecar) as a
`Slide` (levels, pixel size, lazy chunk-exact reads); its label images; `verify_store`.

Reading never writes a slide's files and never makes a store: a sidecar is made by
`tilestore.conversion.open_in_place`, which the user asks for. May import: `tilestore.format`,
`tilestore.sources` (the slide of a sidecar is read through its vendor reader); never
`tilestore.conversion`.
"""

from __future__ import annotations

from tilestore.faces import lazy_face

__getattr__, __dir__, __all__ = lazy_face(
    __name__,
    {
        "tilestore.reading.inplace": ("open_sidecar", "sidecar_for"),
        "tilestore.reading.opening": ("open_slide",),
        "tilestore.reading.labels": ("read_label", "write_label"),
        "tilestore.reading.resolution": (
            "MAX_MPP",
            "MPP_TOLERANCE",
            "OverrideMpp",
            "ScanMpp",
            "check_made",
            "described",
            "in_scan_terms",
            "settle_mpp",
        ),
        "tilestore.reading.slide": ("Level", "Slide", "resize"),
        "tilestore.reading.verify": ("verify_store",),
    },
)
