"""The models' registry (placeholder of learn-models' package)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tilestore.errors import OptionError
from tilestore.learn.models.base import BagOutput

__all__ = ["MODELS", "BagOutput", "ModelSpec", "make_model"]


@dataclass(frozen=True)
class ModelSpec:
    name: str
    build: Callable[..., Any]
    bags: bool
    attention: bool
    help: str


def _abmil(in_dim, outputs, **kw):
    from tilestore.learn.models.abmil import ABMIL

    return ABMIL(in_dim, outputs, **kw)


def _mean(in_dim, outputs, **kw):
    from tilestore.learn.models.mean import MeanPool

    return MeanPool(in_dim, outputs, **kw)


MODELS: dict[str, ModelSpec] = {
    "mean": ModelSpec("mean", _mean, True, False, "mean-pool + linear"),
    "abmil": ModelSpec("abmil", _abmil, True, True, "gated attention (Ilse 2018)"),
}


def make_model(name, in_dim, outputs, **hparams):
    if name not in MODELS:
        raise OptionError(f"model={name!r}: choose among {', '.join(MODELS)}")
    return MODELS[name].build(in_dim, outputs, **hparams)
