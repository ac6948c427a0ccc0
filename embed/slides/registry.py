"""The registered slide encoders, by name (`tilestore.embed.slides.catalogue` holds their
facts); ``random:<name>`` is a registered encoder with random weights (benchmarks, sizing)."""

from __future__ import annotations

from dataclasses import replace

from tilestore.embed.slides.catalogue import ENTRIES
from tilestore.embed.slides.spec import SlideEncoderError, SlideSpec

SLIDE_REGISTRY: dict[str, SlideSpec] = {spec.name: spec for spec in ENTRIES}


def get_slide_encoder(name: str) -> SlideSpec:
    """The spec of a registered slide encoder, or of ``random:<registered name>``."""
    if name in SLIDE_REGISTRY:
        return SLIDE_REGISTRY[name]
    if name.startswith("random:") and name.split(":", 1)[1] in SLIDE_REGISTRY:
        return replace(SLIDE_REGISTRY[name.split(":", 1)[1]], name=name, source="random")
    raise SlideEncoderError(
        f"unknown slide encoder {name!r}; choose one of {', '.join(SLIDE_REGISTRY)} or "
        "random:<name>"
    )


def list_slide_encoders() -> list[SlideSpec]:
    return list(SLIDE_REGISTRY.values())
