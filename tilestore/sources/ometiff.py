"""OME-TIFF: pixel size, objective and channel kind come from the OME-XML."""

from __future__ import annotations

import tifffile

from tilestore.sources.base import Channel, Fact, SourceInfo, checked_mpp
from tilestore.sources.tiff import TiffSource, associated_series

_TO_UM = {"µm": 1.0, "um": 1.0, "nm": 1e-3, "mm": 1e3, "cm": 1e4, "m": 1e6, "pm": 1e-6, "Å": 1e-4}


def ome_color(value: object) -> str | None:
    """OME's Channel Color (a signed 32-bit RGBA integer) as hex RRGGBB."""
    if value is None:
        return None
    try:
        rgba = int(value) & 0xFFFFFFFF
    except (TypeError, ValueError):
        return None
    return f"{rgba >> 8:06X}"


def _as_list(value: object) -> list:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


class OmeTiffSource(TiffSource):
    format = "ome-tiff"
    marked_by = "is_ome"

    def image_series(self, tif: tifffile.TiffFile) -> tifffile.TiffPageSeries:
        # Label and macro images are series too; the slide is the largest.
        return max(tif.series, key=lambda s: s.size)

    def read_info(self, tif: tifffile.TiffFile) -> SourceInfo:
        ome = tifffile.xml2dict(tif.ome_metadata).get("OME", {})
        slide = self.image_series(tif)
        images = _as_list(ome.get("Image"))
        position = tif.series.index(slide)
        image = images[position] if position < len(images) else (images or [{}])[0]
        pixels = image.get("Pixels", {})
        mpp, warning = None, None
        if "PhysicalSizeX" in pixels and "PhysicalSizeY" in pixels:
            units = [pixels.get(f"PhysicalSize{a}Unit", "µm") for a in "XY"]
            if all(u in _TO_UM for u in units):
                mpp, warning = checked_mpp(
                    float(pixels["PhysicalSizeX"]) * _TO_UM[units[0]],
                    float(pixels["PhysicalSizeY"]) * _TO_UM[units[1]],
                    "OME Pixels PhysicalSizeX/PhysicalSizeY",
                )
            else:
                warning = f"ignored OME PhysicalSize in unknown unit {units}"
        objective = None
        for instrument in _as_list(ome.get("Instrument")):
            for obj in _as_list(instrument.get("Objective")):
                if obj.get("NominalMagnification"):
                    objective = Fact(
                        float(obj["NominalMagnification"]), "OME Objective NominalMagnification"
                    )
        modality = None
        channels = _as_list(pixels.get("Channel"))
        named = tuple(Channel(str(c.get("Name", "")), ome_color(c.get("Color"))) for c in channels)
        for channel in channels:
            kind = str(channel.get("IlluminationType", "")).lower()
            if "fluorescence" in kind:
                modality = Fact("fluorescence", f"OME Channel IlluminationType {kind}")
            elif kind == "transmitted":
                modality = Fact("brightfield", "OME Channel IlluminationType transmitted")
        return SourceInfo(
            format=self.format,
            mpp=mpp,
            objective_power=objective,
            modality=modality,
            channels=named if named and all(c.name for c in named) else None,
            warnings=(warning,) if warning else (),
        )

    def read_associated(self, tif: tifffile.TiffFile) -> dict:
        names = {"label image": "label", "label": "label", "macro image": "macro", "macro": "macro"}
        return associated_series(tif, names)
