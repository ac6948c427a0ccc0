"""What a model learns: the task's kind, its target columns and, for classification, each
target's classes; and what follows from them, the model's outputs and each target's block of
logits (`Task.heads`). Decided once, when the cohort is built (`tilestore.learn.cohort`), and
read by the models, the losses, the metrics and the report."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tilestore.errors import OptionError

Kind = Literal["classification", "regression", "survival"]
KINDS: tuple[Kind, ...] = ("classification", "regression", "survival")


@dataclass(frozen=True)
class Task:
    """kind; targets: the label columns (survival: (time column, event column)); classes:
    each classification target's classes as sorted strings (() for the other kinds)."""

    kind: Kind
    targets: tuple[str, ...]
    classes: tuple[tuple[str, ...], ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise OptionError(f"task kind {self.kind!r}: one of {', '.join(KINDS)}")
        if self.kind == "classification" and len(self.classes) != len(self.targets):
            raise OptionError("a classification task names the classes of each target")
        if self.kind == "survival" and len(self.targets) != 2:
            raise OptionError("a survival task's targets are (time column, event column)")
        if self.kind != "classification" and self.classes:
            raise OptionError(f"a {self.kind} task has no classes")

    @property
    def outputs(self) -> int:
        """The model's outputs: a block of logits per classification target, a value per
        regression target, one risk for survival."""
        if self.kind == "classification":
            return sum(len(c) for c in self.classes)
        if self.kind == "regression":
            return len(self.targets)
        return 1

    def heads(self) -> list[slice]:
        """The logits' slice of each classification target, in order ([] for other kinds)."""
        out, start = [], 0
        for classes in self.classes:
            out.append(slice(start, start + len(classes)))
            start += len(classes)
        return out

    def to_json(self) -> dict:
        """The task as a run's config.json holds it (`Task.from_json` reads it back)."""
        return {"kind": self.kind, "targets": list(self.targets),
                "classes": [list(c) for c in self.classes]}  # fmt: skip

    @classmethod
    def from_json(cls, value: dict) -> Task:
        """The task of a config.json (`Task.to_json`)."""
        return cls(
            value["kind"],
            tuple(value["targets"]),
            tuple(tuple(c) for c in value.get("classes") or ()),
        )
