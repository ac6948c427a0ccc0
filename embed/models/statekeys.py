"""Renaming a checkpoint's tensors onto our modules: a key's start looked up in a table of
prefixes, and attentions saved with separate query, key and value stacked into the one
``qkv`` projection timm's blocks keep (DINOv2 as transformers saves it, MUSK's BEiT-3)."""

from __future__ import annotations

import torch

from tilestore.errors import ModelError

State = dict[str, torch.Tensor]


def renamed(key: str, table: dict[str, str], prefix: str = "") -> str | None:
    """`prefix` and the table's name for the start of `key` (the rest kept); None where no
    entry starts it."""
    return next((prefix + v + key[len(k) :] for k, v in table.items() if key.startswith(k)), None)


class Qkv:
    """Query, key and value tensors gathered per target (``...attn.qkv.weight``), in any
    order, then stacked in `order` (`stacked`); `source` names the checkpoint in an error."""

    def __init__(self, order: tuple[str, str, str], source: str) -> None:
        self.order, self.source = order, source
        self.parts: dict[str, dict[str, torch.Tensor]] = {}

    def add(self, target: str, part: str, value: torch.Tensor) -> None:
        self.parts.setdefault(target, {})[part] = value

    def stacked(self) -> State:
        """Each target's three tensors, concatenated; ModelError where one is missing."""
        out: State = {}
        for target, parts in self.parts.items():
            if set(parts) != set(self.order):
                raise ModelError(
                    f"{self.source} has {sorted(parts)} of {', '.join(self.order)} for {target}"
                )
            out[target] = torch.cat([parts[p] for p in self.order])
        return out
