"""PerkinElmer / Akoya QPTIFF (Vectra, Polaris, PhenoImager): one page per channel.

A fluorescence QPTIFF holds one greyscale page per channel at full resolution, then a
thumbnail, then each lower resolution as the same number of pages. Each page's
ImageDescription is a `PerkinElmer-QPI-ImageDescription` XML naming its channel (`Name`,
or `Biomarker` in newer files) and colour (`Color`, "R,G,B"). A brightfield QPTIFF has one RGB
page per level instead, which the generic reader handles.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import tifffile

from tilestore.sources.base import Channel, Fact, SourceInfo
from tilestore.sources.tiff import TiffSource, associated_series, resolution_mpp


def _description(page: tifffile.TiffPage) -> dict[str, str]:
    """The flat elements of a page's QPI description XML (empty where it is not one)."""
    try:
        root = ET.fromstring(page.description)
    except ET.ParseError:
        return {}
    return {child.tag: (child.text or "").strip() for child in root}


def _color(text: str | None) -> str | None:
    """QPI's "R,G,B" as hex RRGGBB."""
    parts = re.findall(r"\d+", text or "")
    if len(parts) != 3 or any(int(p) > 255 for p in parts):
        return None
    return "".join(f"{int(p):02X}" for p in parts)


class QptiffSource(TiffSource):
    format = "qptiff"
    marked_by = "is_qpi"

    def read_info(self, tif: tifffile.TiffFile) -> SourceInfo:
        level = tif.series[0].levels[0]
        pages = [_description(p) for p in level.pages]
        first = pages[0] if pages else {}
        mpp, warning = resolution_mpp(level.keyframe)
        objective = re.match(r"\s*(\d+(?:\.\d+)?)", first.get("Objective", ""))
        channels, modality = None, None
        if len(level.pages) > 1 or level.keyframe.samplesperpixel == 1:
            names = [p.get("Biomarker") or p.get("Name") or f"C{i}" for i, p in enumerate(pages)]
            channels = tuple(
                Channel(name, _color(p.get("Color"))) for name, p in zip(names, pages, strict=True)
            )
            modality = Fact(
                "fluorescence",
                f"QPTIFF: one greyscale page per channel ({', '.join(names)})",
            )
        return SourceInfo(
            format=self.format,
            vendor="akoya",
            mpp=mpp,
            objective_power=(
                Fact(float(objective.group(1)), "QPTIFF Objective") if objective else None
            ),
            modality=modality,
            channels=channels,
            warnings=(warning,) if warning else (),
        )

    def read_associated(self, tif: tifffile.TiffFile) -> dict:
        return associated_series(
            tif, {"thumbnail": "thumbnail", "macro": "macro", "label": "label"}
        )
