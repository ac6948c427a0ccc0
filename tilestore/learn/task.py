"""What a cohort asks a model to predict: the task's kind, its targets and their classes.

A placeholder written to the shared plan of issue 65 (docs: /work/briefs/learn_api.md) so the
losses have a task to read; helper "learn-data" owns this module and its version wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["classification", "regression", "survival"]


@dataclass(frozen=True)
class Task:
    """The kind, the targets (survival: (time column, event column)) and, for
    classification, each target's classes (sorted strings)."""

    kind: Kind
    targets: tuple[str, ...]
    classes: tuple[tuple[str, ...], ...] = ()

    @property
    def outputs(self) -> int:
        """The model's outputs: one block of logits per classification target, one value per
        regression target, one risk for survival."""
        if self.kind == "classification":
            return sum(len(c) for c in self.classes)
        return len(self.targets) if self.kind == "regression" else 1

    def heads(self) -> list[slice]:
        """Each classification target's slice of the logits."""
        slices, start = [], 0
        for classes in self.classes:
            slices.append(slice(start, start + len(classes)))
            start += len(classes)
        return slices
