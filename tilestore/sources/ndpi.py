"""Hamamatsu NDPI: striped JPEG levels; resolution tags in centimetres, vendor tags."""

from __future__ import annotations

import tifffile

from tilestore.sources.base import Fact, SourceInfo
from tilestore.sources.tiff import TiffSource, associated_series, resolution_mpp


class NdpiSource(TiffSource):
    format = "ndpi"
    marked_by = "is_ndpi"

    def read_info(self, tif: tifffile.TiffFile) -> SourceInfo:
        page = tif.pages.first
        tags = page.ndpi_tags or {}
        mpp, warning = resolution_mpp(page)
        mag = tags.get("Magnification")
        fluorescence = tags.get("Fluorescence")
        modality = (
            Fact("fluorescence", f"NDPI Fluorescence tag ({fluorescence})")
            if fluorescence
            else None
        )
        return SourceInfo(
            format=self.format,
            vendor="hamamatsu",
            mpp=mpp,
            objective_power=Fact(float(mag), "NDPI Magnification tag") if mag else None,
            modality=modality,
            warnings=(warning,) if warning else (),
        )

    def read_associated(self, tif: tifffile.TiffFile) -> dict:
        return associated_series(tif, {"macro": "macro", "map": "map"})
