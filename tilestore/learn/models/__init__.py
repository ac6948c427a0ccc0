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
    (whether its output carries per-tile attention), one line of help; one_class_target:
    it trains on one classification target only (CLAM's instance loss needs the class);
    sized_by: the `LearnOptions` fields it is built with (a linear model has no width and
    no dropout: weight decay regularises it)."""

    name: str
    build: Callable[..., nn.Module]
    bags: bool
    attention: bool
    help: str
    one_class_target: bool = False
    sized_by: tuple[str, ...] = ("hidden", "dropout")


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


def _spec(
    name: str, module: str, cls: str, bags: bool, attention: bool, help: str, **facts: Any
) -> ModelSpec:
    return ModelSpec(
        name, _lazy(name, module, cls), bags=bags, attention=attention, help=help, **facts
    )


# name, module, class, bags of tiles (else one vector per slide or patient), attention, help
MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        _spec("mean", "mean", "MeanPool", True, False,
              "Mean of the tiles' features and a linear layer: the baseline.", sized_by=()),
        _spec("abmil", "abmil", "ABMIL", True, True, "Gated attention MIL (Ilse et al. 2018)."),
        _spec("transmil", "transmil", "TransMIL", True, False,
              "Transformer MIL with Nystrom attention and PPEG (Shao et al. 2021)."),
        _spec("clam-sb", "clam_sb", "ClamSB", True, True,
              "CLAM, single branch: ABMIL with instance-level clustering (Lu et al. 2021).",
              one_class_target=True),
        _spec("linear", "linear", "Linear", False, False,
              "A linear head on one vector per slide or patient (logistic, linear, Cox).",
              sized_by=()),
    )
}  # fmt: skip


def make_model(name: str, in_dim: int, outputs: int, **hparams: Any) -> nn.Module:
    """The model `name` for features of width `in_dim` and `outputs` outputs; an unknown
    name, hparam or value: one OptionError."""
    if name not in MODELS:
        raise OptionError(f"model={name!r}: not a model; known are {', '.join(MODELS)}")
    return MODELS[name].build(in_dim, outputs, **hparams)


def check_model(name: str, task: Any, vectors: bool) -> None:
    """Refuse (OptionError, one line) a model that cannot learn this cohort: a bag model on
    slide vectors (`vectors`: the cohort holds one slide encoder's vector per slide), a
    vector model on tile features, CLAM-SB on anything but one classification target."""
    spec = MODELS[name]
    if vectors and spec.bags:
        raise OptionError(
            f"model={name!r} reads bags of tile features; this cohort holds one slide vector "
            "per slide (its slide encoder's): use --arch linear"
        )
    if not vectors and not spec.bags:
        raise OptionError(
            f"model={name!r} reads one vector per slide; this cohort holds tile features: "
            "use --arch mean (the linear head on the tiles' mean) or build the cohort of a "
            "slide encoder's vectors (--slide-encoder)"
        )
    if spec.one_class_target and (task.kind != "classification" or len(task.targets) != 1):
        raise OptionError(
            f"model={name!r} learns one classification target (its instance loss needs the "
            f"class); this task is {task.kind} of {len(task.targets)} target(s)"
        )
