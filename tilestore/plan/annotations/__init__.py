"""Load ROI annotations (QuPath GeoJSON, Aperio XML, ASAP XML) as level-0 pixel polygons.

>>> rois = load_annotations("case.geojson", size=(slide_w, slide_h))
>>> rois.select("Tumor").union()
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path

from tilestore.errors import AnnotationError
from tilestore.plan.annotations.aperio import AperioXmlReader
from tilestore.plan.annotations.asap import AsapXmlReader
from tilestore.plan.annotations.base import Annotations, Shape, finish
from tilestore.plan.annotations.geojson import GeoJsonReader, load_json

JSON_READERS = (GeoJsonReader,)
XML_READERS = (AperioXmlReader, AsapXmlReader)

__all__ = ["Annotations", "Shape", "load_annotations"]


def load_annotations(
    path: str | os.PathLike,
    *,
    size: tuple[int, int] | None = None,
    scale: float = 1.0,
) -> Annotations:
    """Return the area annotations in a file, in level-0 pixels of the slide.

    size: the slide's level-0 (width, height); shapes are clipped to it.
    scale: multiply coordinates, for annotations made at another resolution
        (roi_mpp / slide_mpp).
    """
    path = Path(path)
    try:
        head = path.read_bytes()[:64].lstrip(b"\xef\xbb\xbf \t\r\n")
    except OSError as exc:
        raise AnnotationError(f"{path}: cannot read: {exc.strerror}") from exc
    if head.startswith((b"{", b"[")):
        data = load_json(path)
        for reader in JSON_READERS:
            if reader.sniff(data):
                return finish(path, reader.format, reader.read(path, data), scale=scale, size=size)
        raise AnnotationError(f"{path}: {_unsupported_json(data)}")
    if head.startswith(b"<"):
        try:
            root = ET.parse(path).getroot()
        except ET.ParseError as exc:
            raise AnnotationError(f"{path}: malformed XML: {exc}") from exc
        for reader in XML_READERS:
            if root.tag == reader.root_tag:
                shapes, file_mpp = reader.read(path, root)
                return finish(
                    path, reader.format, shapes, scale=scale, size=size, file_mpp=file_mpp
                )
        raise AnnotationError(
            f"{path}: XML root <{root.tag}> is neither Aperio ImageScope "
            "<Annotations> nor <ASAP_Annotations>"
        )
    raise AnnotationError(
        f"{path}: not an annotation file (expected QuPath GeoJSON, Aperio XML or ASAP XML)"
    )


def _unsupported_json(data: object) -> str:
    item = data[0] if isinstance(data, list) and data else data
    if isinstance(item, dict) and "annotation" in item and "location" in item["annotation"]:
        return (
            "Cytomine annotation JSON is not supported (WKT with y pointing up); "
            "export GeoJSON from QuPath or Cytomine instead"
        )
    if isinstance(item, dict) and "slideId" in item and "content" in item:
        return (
            "Sectra PathologyCore JSON is not supported (coordinates are fractions of an "
            "unstated reference size); export GeoJSON instead"
        )
    return "JSON that is not GeoJSON (no Feature or FeatureCollection)"
