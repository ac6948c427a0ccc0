"""Aperio SVS: mpp and objective power live in the ImageDescription."""

from __future__ import annotations

import tifffile
from tifffile.tifffile import svs_description_metadata

from tilestore.sources.base import Fact, SourceInfo, checked_mpp
from tilestore.sources.tiff import TiffSource, associated_series


class SvsSource(TiffSource):
    format = "svs"
    marked_by = "is_svs"

    def read_info(self, tif: tifffile.TiffFile) -> SourceInfo:
        meta = svs_description_metadata(tif.pages.first.description)
        mpp = meta.get("MPP")
        mpp_fact, warning = checked_mpp(mpp, mpp, "SVS ImageDescription MPP")
        mag = meta.get("AppMag")
        return SourceInfo(
            format=self.format,
            vendor="aperio",
            mpp=mpp_fact,
            objective_power=Fact(float(mag), "SVS ImageDescription AppMag") if mag else None,
            warnings=(warning,) if warning else (),
        )

    def read_associated(self, tif: tifffile.TiffFile) -> dict:
        return associated_series(
            tif, {"label": "label", "macro": "macro", "thumbnail": "thumbnail"}
        )
