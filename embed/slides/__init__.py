"""Slide encoders: one vector per slide from its stored tile features.

>>> get_slide_encoder("titan")                 # the facts: tile model, um/px, tile, dim
>>> report = embed_slides(stores, "titan")     # reads embeddings/conch-v1.5, writes
...                                            # embeddings/conch-v1.5/slides/titan
>>> tilestore.open_embeddings(stores, "conch-v1.5", slide_encoder="titan")  # (slide, feature)
>>> embed_patients(stores, "patients.csv", "patients.parquet")  # MOOZY: a row per patient
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tilestore.faces import lazy_face

# loaded on first use: the facts (`get_slide_encoder`) without torch, for the command's checks
__getattr__, __dir__, __all__ = lazy_face(
    __name__,
    {
        "tilestore.embed.slides.load": (
            "LoadedSlideEncoder",
            "build",
            "load_slide_encoder",
            "pull_slide_encoder",
            "slide_is_cached",
        ),
        "tilestore.embed.slides.registry": (
            "SLIDE_REGISTRY",
            "encoder_tiles",
            "get_slide_encoder",
            "guides_missing",
            "list_slide_encoders",
            "tile_model_for",
        ),
        "tilestore.embed.slides.patients": (
            "PatientReport",
            "PatientTable",
            "embed_patients",
            "read_patient_table",
        ),
        "tilestore.embed.slides.run": ("SlideReport", "embed_slides"),
        "tilestore.embed.slides.spec": ("SlidePrecision", "SlideSpec"),
        "tilestore.errors": ("PatientTableError", "SlideEncoderError"),
    },
)

if TYPE_CHECKING:
    from tilestore.embed.slides.load import (
        LoadedSlideEncoder,
        build,
        load_slide_encoder,
        pull_slide_encoder,
        slide_is_cached,
    )
    from tilestore.embed.slides.patients import (
        PatientReport,
        PatientTable,
        embed_patients,
        read_patient_table,
    )
    from tilestore.embed.slides.registry import (
        SLIDE_REGISTRY,
        encoder_tiles,
        get_slide_encoder,
        guides_missing,
        list_slide_encoders,
        tile_model_for,
    )
    from tilestore.embed.slides.run import SlideReport, embed_slides
    from tilestore.embed.slides.spec import SlidePrecision, SlideSpec
    from tilestore.errors import PatientTableError, SlideEncoderError
