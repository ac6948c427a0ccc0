"""OME-Zarr 0.5 metadata: multiscales for images and label images, omero rendering hints.

Coordinates follow OME-Zarr: physical position = scale * index + translation, at
pixel centres. A level downsampled by d has its first pixel centred at
(d - 1) / 2 level-0 pixels, hence the translation; without it a viewer shifts
each coarser level by up to half a pixel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

OME_VERSION = "0.5"
RGB_COLORS = ("FF0000", "00FF00", "0000FF")


def axes(mpp_known: bool) -> list[dict[str, str]]:
    """Return the (c, y, x) axes; spatial units only when the pixel size is known."""
    space = {"type": "space", "unit": "micrometer"} if mpp_known else {"type": "space"}
    return [{"name": "c", "type": "channel"}, {"name": "y", **space}, {"name": "x", **space}]


def level_transforms(
    downsample: Sequence[float], mpp: Sequence[float] | None
) -> list[dict[str, Any]]:
    """Return scale + translation for a level downsampled by (dy, dx) from level 0.

    `mpp` is (x, y) in µm; without it the unit is level-0 pixels.
    """
    dy, dx = downsample
    py, px = (mpp[1], mpp[0]) if mpp else (1.0, 1.0)
    scale = [1.0, dy * py, dx * px]
    transforms: list[dict[str, Any]] = [{"type": "scale", "scale": scale}]
    if dy != 1 or dx != 1:
        translation = [0.0, (dy - 1) / 2 * py, (dx - 1) / 2 * px]
        transforms.append({"type": "translation", "translation": translation})
    return transforms


def multiscales(
    name: str,
    paths: Sequence[str],
    downsamples: Sequence[Sequence[float]],
    mpp: Sequence[float] | None,
    method: str = "box average (2x2) of the level above; source levels as scanned",
) -> list[dict[str, Any]]:
    """Return the ``multiscales`` list for an image or label image."""
    return [
        {
            "name": name,
            "axes": axes(mpp is not None),
            "datasets": [
                {"path": path, "coordinateTransformations": level_transforms(ds, mpp)}
                for path, ds in zip(paths, downsamples, strict=True)
            ],
            "metadata": {"method": method},
        }
    ]


def channel_labels(channels: int, rgb: bool, names: Sequence[str] | None = None) -> list[str]:
    """Return channel labels: the source's names, R/G/B for brightfield, else C0, C1..."""
    if names and len(names) == channels:
        return list(names)
    return ["R", "G", "B"] if rgb and channels == 3 else [f"C{i}" for i in range(channels)]


def omero(
    labels: Sequence[str],
    dtype_max: float,
    rgb: bool,
    colors: Sequence[str | None] | None = None,
    windows: Sequence[tuple[float, float]] | None = None,
) -> dict[str, Any]:
    """Rendering hints: brightfield RGB in colour at full range; other channels in the file's
    colours (else DAPI/Hoechst blue and a palette), each shown over its `windows` (start, end)
    where given, within the dtype's range."""
    channels = len(labels)
    if rgb and channels == 3:
        shown = list(RGB_COLORS)
    else:
        given = list(colors) if colors and len(colors) == channels else [None] * channels
        pairs = enumerate(zip(given, labels, strict=True))
        shown = [color or _default_color(label, i) for i, (color, label) in pairs]
    spans = list(windows) if windows and len(windows) == channels else [(0, dtype_max)] * channels
    return {
        "channels": [
            {
                "color": color,
                "label": label,
                "active": True,
                "window": {"min": 0, "max": dtype_max, "start": start, "end": end},
            }
            for color, label, (start, end) in zip(shown, labels, spans, strict=True)
        ],
        "rdefs": {"model": "color" if rgb else "greyscale"},
    }


NUCLEAR = ("dapi", "hoechst")  # nuclear stains, by name
_PALETTE = ("00FF00", "FF0000", "FF00FF", "00FFFF", "FFFF00", "FF8000", "FFFFFF")


def _default_color(label: str, index: int) -> str:
    if any(label.lower().startswith(n) for n in NUCLEAR):
        return "0000FF"
    return _PALETTE[index % len(_PALETTE)]
