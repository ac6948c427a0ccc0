"""A learning task: its kind, targets and classes (placeholder of learn-data's module)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["classification", "regression", "survival"]


@dataclass(frozen=True)
class Task:
    kind: Kind
    targets: tuple[str, ...]
    classes: tuple[tuple[str, ...], ...] = ()

    @property
    def outputs(self) -> int:
        if self.kind == "classification":
            return sum(len(c) for c in self.classes)
        if self.kind == "regression":
            return len(self.targets)
        return 1

    def heads(self) -> list[slice]:
        out, start = [], 0
        for c in self.classes:
            out.append(slice(start, start + len(c)))
            start += len(c)
        return out
