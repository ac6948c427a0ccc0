"""How to train a model on a cohort's bags (`LearnOptions`): each option declared once here
(`tilestore.options`); `tilestore crossval` / `train` generate their flags from it, and a
run folder's config.json records it whole. No torch: the model name is checked against the
registry's names only."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Annotated, Any

from tilestore.errors import OptionError
from tilestore.options import Declared, Device, Opt

Precision = Annotated[
    str,
    Opt(
        "Features on the device as float32 or bfloat16.",
        pattern=r"float32|bfloat16",
        shape="'float32' or 'bfloat16'",
    ),
]
Schedule = Annotated[
    str,
    Opt(
        "The learning rate over a fold: 'one-cycle' (up to --lr over the first 30% of the"
        " steps, then down, as torch's OneCycleLR) or 'constant'.",
        pattern=r"one-cycle|constant",
        shape="'one-cycle' or 'constant'",
    ),
]


@dataclass(frozen=True)
class LearnOptions(Declared):
    """How to train: the model and its size, the optimiser, early stopping, the device.

    The defaults (batch 32, one-cycle to lr 3e-4, weight decay 0.1, dropout 0.5) are the
    row of bench/learn_defaults.py's table that learned a weak signal best (bench/RESULTS.md):
    ABMIL with batch 1 or 8 and no regularisation memorised 128 training bags in a few
    epochs and its folds fell to AUROC 0.55.

    A run with the same options, cohort, splits and seed on the same machine gives the same
    weights, bit for bit (`tilestore.learn.training.fit`)."""

    model: Annotated[
        str, Opt("The model trained (tilestore.learn.MODELS): abmil, mean, ...", flag="arch")
    ] = "abmil"
    hidden: Annotated[int, Opt("The model's hidden width.", low=1, high=65_536)] = 128
    dropout: Annotated[float, Opt("Dropout in the model.", low=0, high=0.9)] = 0.5
    epochs: Annotated[int, Opt("Most epochs per fold.", low=1, high=100_000)] = 32
    patience: Annotated[
        int,
        Opt(
            "Stop a fold after this many epochs without a better validation loss.",
            low=1,
            high=100_000,
        ),
    ] = 8
    batch_size: Annotated[int, Opt("Bags per step (padded to the longest).", low=1, high=4096)] = 32
    lr: Annotated[float, Opt("AdamW's (peak) learning rate.", low=0, high=1, above=True)] = 3e-4
    weight_decay: Annotated[float, Opt("AdamW's weight decay.", low=0, high=1)] = 0.1
    schedule: Schedule = "one-cycle"
    max_tiles: Annotated[
        int | None,
        Opt("Tiles sampled per training bag each epoch.", low=1, high=10**8, none="every tile"),
    ] = None
    balanced: Annotated[bool, Opt("Weight the classes by their inverse frequency.")] = True
    seed: Annotated[
        int, Opt("Seed of the weights, the order and the sampling.", low=0, high=2**31 - 1)
    ] = 0
    device: Device = None
    dtype: Precision = "float32"
    threads: Annotated[
        int | None,
        Opt("torch's CPU threads while training.", low=1, high=1024, none="torch's default"),
    ] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        from tilestore.learn.models import MODELS

        if self.model not in MODELS:
            raise OptionError(
                f"model={self.model!r}: no such model; choose among {', '.join(sorted(MODELS))}"
            )

    def hparams(self) -> dict[str, Any]:
        """What the model is built with besides its input and output widths."""
        from tilestore.learn.models import MODELS

        return {k: getattr(self, k) for k in MODELS[self.model].sized_by}

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def resolve_device(device: str | None) -> str:
    """The device a run uses: the one named, else cuda where present, else cpu."""
    if device is not None:
        if device.startswith("cuda"):
            import torch

            if not torch.cuda.is_available():
                raise OptionError(f"device={device!r}: no CUDA device here; use --device cpu")
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
