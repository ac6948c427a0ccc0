"""The slide encoders' architectures, by builder name (`SlideSpec.arch`).

Every module takes one slide's tile features (n, in_dim) and their grid cells (n, 2: col,
row; used where the class says ``grid = True``), and where its spec names a guide the guide
model's features of the same tiles (`guide`), and returns its slide embedding (dim,); an
encoder that defines a patient's vector (MOOZY) has ``patient(slide_vectors) -> (dim,)``.
"""

from __future__ import annotations

from tilestore.embed.slides.nets.abmil import Chief, Eagle, Feather, Madeleine
from tilestore.embed.slides.nets.cobra import Cobra
from tilestore.embed.slides.nets.longnet import LongNetSlide
from tilestore.embed.slides.nets.moozy import Moozy
from tilestore.embed.slides.nets.perceiver import Prism
from tilestore.embed.slides.nets.pool import Max, Mean
from tilestore.embed.slides.nets.titan import Titan

BUILDERS = {
    "mean": Mean,
    "max": Max,
    "feather": Feather,
    "madeleine": Madeleine,
    "chief": Chief,
    "eagle": Eagle,
    "titan": Titan,
    "prism": Prism,
    "longnet": LongNetSlide,
    "moozy": Moozy,
    "cobra": Cobra,
}

__all__ = ["BUILDERS"]
