"""What every model returns (placeholder of learn-models' module)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class BagOutput:
    logits: Any
    attention: Any = None
