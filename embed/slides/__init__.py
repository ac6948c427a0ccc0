"""Slide encoders: one vector per slide from its stored tile features.

>>> get_slide_encoder("titan")                 # the facts: tile model, um/px, tile, dim
>>> report = embed_slides(stores, "titan")     # reads embeddings/conch-v1.5, writes
...                                            # embeddings/conch-v1.5/slides/titan
>>> tilestore.open_embeddings(stores, "conch-v1.5", slide_encoder="titan")  # (slide, feature)
"""

from tilestore.embed.slides.load import (
    LoadedSlideEncoder,
    build,
    load_slide_encoder,
    pull_slide_encoder,
    slide_is_cached,
)
from tilestore.embed.slides.registry import (
    SLIDE_REGISTRY,
    get_slide_encoder,
    list_slide_encoders,
)
from tilestore.embed.slides.run import SlideReport, embed_slides, tile_model_for
from tilestore.embed.slides.spec import SlideEncoderError, SlideSpec

__all__ = [
    "SLIDE_REGISTRY",
    "LoadedSlideEncoder",
    "SlideEncoderError",
    "SlideReport",
    "SlideSpec",
    "build",
    "embed_slides",
    "get_slide_encoder",
    "list_slide_encoders",
    "load_slide_encoder",
    "pull_slide_encoder",
    "slide_is_cached",
    "tile_model_for",
]
