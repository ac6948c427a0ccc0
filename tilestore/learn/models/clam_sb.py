"""CLAM-SB: clustering-constrained attention MIL, single attention branch (Lu et al., Nature
Biomedical Engineering 2021, "Data-efficient and weakly supervised computational pathology on
whole-slide images").

The bag model is ABMIL (`tilestore.learn.models.abmil`: Linear + ReLU, gated attention, a
linear head over the attention-pooled vector); CLAM adds one instance classifier per class
(hidden -> 2), trained on pseudo-labels: the k tiles of highest attention are the bag's class
("in the class"), its k of lowest attention are not; for multi-class subtyping, the k highest
tiles are also "not" for every other class. `instance_loss` is that term; `training_loss`
(what `tilestore.learn.training.fit` minimises for this model) weighs it with the bag's loss
as CLAM does (`bag_weight` 0.7 bag, 0.3 instance), from one forward pass. Inference is
ABMIL's. One classification target only (`MODELS["clam-sb"].kinds`).

`from_reference("clam", state_dict)` takes CLAM's `CLAM_SB` weights, instance classifiers too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tilestore.learn.models.abmil import ABMIL, built, clam_names, renamed
from tilestore.learn.models.base import (
    AttentionDim,
    Dropout,
    Gated,
    Hidden,
    InDim,
    Outputs,
)
from tilestore.options import Opt, checked

KSample = Annotated[
    int, Opt("Tiles of highest and lowest attention per bag for CLAM's instance loss.", low=1)
]
BagWeight = Annotated[
    float, Opt("The bag loss's weight in training; the instance loss has the rest.", low=0, high=1)
]
Subtyping = Annotated[
    bool, Opt("The classes are subtypes: a bag's top tiles are 'not' for the other classes.")
]


class ClamSB(ABMIL):
    """ABMIL (ReLU encoder, gated attention) with CLAM's instance classifiers."""

    @checked
    def __init__(
        self,
        in_dim: InDim,
        outputs: Outputs,
        *,
        hidden: Hidden = 512,
        attention_dim: AttentionDim = 256,
        gated: Gated = True,
        dropout: Dropout = 0.0,
        k_sample: KSample = 8,
        subtyping: Subtyping = False,
        bag_weight: BagWeight = 0.7,
    ) -> None:
        super().__init__(
            in_dim, outputs, hidden=hidden, attention_dim=attention_dim, gated=gated,
            dropout=dropout,
        )  # fmt: skip
        self.instance = nn.ModuleList(nn.Linear(hidden, 2) for _ in range(outputs))
        self.k_sample = k_sample
        self.subtyping = subtyping
        self.bag_weight = bag_weight

    def training_loss(self, x: Tensor, mask: Tensor | None, y: Tensor, bag_loss) -> Tensor:
        """bag_weight * bag_loss(logits, y) + (1 - bag_weight) * the instance loss, of one
        forward pass; y (B, 1) the bags' class indices."""
        h, attention, mask = self.attend(x, mask)
        bag = bag_loss(self.head(self.pooled(h, attention)).float(), y)
        instance = self._instance_loss(h, attention, mask, y[:, 0].long())
        return self.bag_weight * bag + (1 - self.bag_weight) * instance.float()

    def instance_loss(self, x: Tensor, label: Tensor, mask: Tensor | None = None) -> Tensor:
        """CLAM's instance-level loss, averaged over the batch's bags: `label` (B,) the class
        index of each bag (one classification target: the outputs are its classes)."""
        return self._instance_loss(*self.attend(x, mask), label)

    def _instance_loss(self, h: Tensor, attention: Tensor, mask: Tensor, label: Tensor) -> Tensor:
        losses = []
        for b in range(h.shape[0]):
            real = mask[b]
            hb, ab = h[b][real], attention[b][real]
            k = min(self.k_sample, hb.shape[0])
            top, bottom = hb[ab.topk(k).indices], hb[(-ab).topk(k).indices]
            terms = []
            for c, classifier in enumerate(self.instance):
                if c == int(label[b]):
                    logits = classifier(torch.cat([top, bottom]))
                    targets = torch.cat([_filled(k, 1, h), _filled(k, 0, h)])
                elif self.subtyping:
                    logits, targets = classifier(top), _filled(k, 0, h)
                else:
                    continue
                terms.append(F.cross_entropy(logits, targets))
            total = torch.stack(terms).sum()
            losses.append(total / len(self.instance) if self.subtyping else total)
        return torch.stack(losses).mean()


def _filled(k: int, value: int, like: Tensor) -> Tensor:
    return torch.full((k,), value, dtype=torch.long, device=like.device)


def from_reference(name: str, state_dict: Mapping[str, Tensor]) -> ClamSB:
    """Our CLAM-SB holding the weights of CLAM's `CLAM_SB` (name "clam")."""
    if name != "clam":
        raise ValueError(f"no CLAM-SB reference {name!r}: known is clam")
    names = clam_names(state_dict) | {"instance_classifiers.": "instance."}
    return built(ClamSB, renamed(state_dict, names))
