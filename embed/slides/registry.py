"""The registered slide encoders, by name (`tilestore.embed.slides.catalogue` holds their
facts); ``random:<name>`` is a registered encoder with random weights (benchmarks, sizing)."""

from __future__ import annotations

from dataclasses import replace

from tilestore.embed.slides.catalogue import ENTRIES
from tilestore.embed.slides.spec import SlideSpec
from tilestore.errors import SlideEncoderError

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


def tile_model_for(spec: SlideSpec, model: str | None) -> str:
    """The tile model whose features the encoder reads: its own; `model` must agree."""
    if spec.tile_model is None:
        if model is None:
            raise SlideEncoderError(f"{spec.name} pools any tile model's features: name one")
        return model
    if model is not None and model not in spec.tile_models():
        raise SlideEncoderError(
            f"{spec.name} reads {spec.tile_model} tile features, not {model}: leave "
            f"--model out or give --model {spec.tile_model}"
        )
    return model or spec.tile_model
