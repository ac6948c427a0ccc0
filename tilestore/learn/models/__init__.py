"""The models trained on stored features, by name: one module each, one `ModelSpec` of
plain facts each here (whether it reads bags of tiles or one vector per slide or patient,
whether it returns attention, one line of help), in the order `--help` lists them.

Every model is an `nn.Module` with `forward(x, mask=None) -> BagOutput` (x: bags (B, N, D),
mask (B, N) True for real tiles; a vector model: (B, D)) and `tile_scores(x, mask=None)`
(B, N, outputs): each tile's contribution to the prediction. The registry imports no torch:
a model's module loads when the model is built.

>>> model = make_model("abmil", in_dim=1024, outputs=2, dropout=0.25)
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tilestore.errors import OptionError

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class ModelSpec:
    """One model: its name, how it is built (in_dim, outputs, **hparams; its module loaded
    then), bags (True: bags of tiles; False: one vector per slide or patient), attention
    (whether its output carries per-tile attention), one line of help."""

    name: str
    build: Callable[..., nn.Module]
    bags: bool
    attention: bool
    help: str


def _lazy(name: str, module: str, cls: str) -> Callable[..., nn.Module]:
    """Builds the class `cls` of `module` (imported at the first build); an hparam the
    model does not take: one OptionError naming those it does."""

    def build(in_dim: int, outputs: int, **hparams: Any) -> nn.Module:
        model = getattr(importlib.import_module(f"tilestore.learn.models.{module}"), cls)
        takes = [
            p.name
            for p in inspect.signature(model.__init__).parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY
        ]
        unknown = sorted(set(hparams) - set(takes))
        if unknown:
            raise OptionError(
                f"model {name!r} takes no {', '.join(unknown)}: it takes "
                f"{', '.join(takes) or 'no hyper-parameters'}"
            )
        return model(in_dim, outputs, **hparams)

    return build


def _spec(name: str, module: str, cls: str, bags: bool, attention: bool, help: str) -> ModelSpec:
    return ModelSpec(name, _lazy(name, module, cls), bags=bags, attention=attention, help=help)


# name, module, class, bags of tiles (else one vector per slide or patient), attention, help
MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        _spec("mean", "mean", "MeanPool", True, False,
              "Mean of the tiles' features and a linear layer: the baseline."),
        _spec("abmil", "abmil", "ABMIL", True, True, "Gated attention MIL (Ilse et al. 2018)."),
        _spec("transmil", "transmil", "TransMIL", True, False,
              "Transformer MIL with Nystrom attention and PPEG (Shao et al. 2021)."),
        _spec("clam-sb", "clam_sb", "ClamSB", True, True,
              "CLAM, single branch: ABMIL with instance-level clustering (Lu et al. 2021)."),
        _spec("linear", "linear", "Linear", False, False,
              "A linear head on one vector per slide or patient (logistic, linear, Cox)."),
    )
}  # fmt: skip


def make_model(name: str, in_dim: int, outputs: int, **hparams: Any) -> nn.Module:
    """The model `name` for features of width `in_dim` and `outputs` outputs; an unknown
    name, hparam or value: one OptionError."""
    if name not in MODELS:
        raise OptionError(f"model={name!r}: not a model; known are {', '.join(MODELS)}")
    return MODELS[name].build(in_dim, outputs, **hparams)
