"""ABMIL: gated attention-based multiple instance learning (Ilse, Tomczak & Welling, ICML
2018, arXiv:1802.04712).

    h_i   = encoder(x_i)                         Linear(in_dim, hidden), ReLU or GELU, dropout
    s_i   = w . (tanh(V h_i) * sigmoid(U h_i))   the gated attention score (V, U: to attention_dim)
    a     = softmax of s over the bag's real tiles
    z     = post(sum_i a_i h_i)                  optional Linear + activation (TRIDENT has one)
    logit = W z + b

Each tile's score is its attention times the head applied to it, a_i (W h_i): without
`post` (the default) a bag's tile scores sum exactly to its logits minus b. With `post`
(nonlinear) the scores a_i W post(h_i) are an approximation of the tile's share.

`from_reference("trident" | "clam", state_dict)` builds the model holding the weights of
TRIDENT's `ABMILSlideEncoder` followed by a linear classifier (keys `feature_encoder.model.*`
and `classifier.*`, as TRIDENT's tutorial names them) or of CLAM's `CLAM_SB` (its attention
network and bag classifier; its instance classifiers belong to `clam_sb`), so that the
forward passes can be compared (bench/learn_reference.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

import torch
from torch import Tensor, nn

from tilestore.learn.models.base import (
    Activation,
    AttentionDim,
    BagOutput,
    Dropout,
    Gated,
    Hidden,
    InDim,
    Outputs,
    full_mask,
    masked_softmax,
    zero_padding,
)
from tilestore.options import Opt, checked

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU}
Post = Annotated[bool, Opt("A Linear + activation after the pooling (TRIDENT's encoder).")]


class GatedAttention(nn.Module):
    """One attention score per tile: w . (tanh(V h) * sigmoid(U h)); without the gate,
    w . tanh(V h) (Ilse 2018, eq. 8 and 9)."""

    def __init__(self, dim: int, attention_dim: int, gated: bool, dropout: float) -> None:
        super().__init__()
        self.a = nn.Linear(dim, attention_dim)  # V
        self.b = nn.Linear(dim, attention_dim) if gated else None  # U, the gate
        self.c = nn.Linear(attention_dim, 1)  # w
        self.dropout = nn.Dropout(dropout)

    def forward(self, h: Tensor) -> Tensor:
        """Raw scores (B, N) before the softmax."""
        v = torch.tanh(self.a(h))
        if self.b is not None:
            v = v * torch.sigmoid(self.b(h))
        return self.c(self.dropout(v)).squeeze(-1)


class ABMIL(nn.Module):
    """Gated attention MIL over bags (B, N, D) with a linear head."""

    @checked
    def __init__(
        self,
        in_dim: InDim,
        outputs: Outputs,
        *,
        hidden: Hidden = 512,
        attention_dim: AttentionDim = 256,
        activation: Activation = "relu",
        gated: Gated = True,
        post: Post = False,
        dropout: Dropout = 0.0,
    ) -> None:
        super().__init__()
        act = ACTIVATIONS[activation]
        self.encoder = nn.Sequential(nn.Linear(in_dim, hidden), act(), nn.Dropout(dropout))
        self.attention = GatedAttention(hidden, attention_dim, gated, dropout)
        self.post = (
            nn.Sequential(nn.Linear(hidden, hidden), act(), nn.Dropout(dropout)) if post else None
        )
        self.head = nn.Linear(hidden, outputs)

    def attend(self, x: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """The tiles' encodings h (B, N, hidden), their attention (B, N) and the mask."""
        mask = full_mask(x, mask)
        h = self.encoder(zero_padding(x, mask))
        return h, masked_softmax(self.attention(h), mask), mask

    def pooled(self, h: Tensor, attention: Tensor) -> Tensor:
        """The bag's vector: sum_i a_i h_i, then `post` where there is one."""
        z = torch.einsum("bn,bnd->bd", attention, h)
        return self.post(z) if self.post is not None else z

    def forward(self, x: Tensor, mask: Tensor | None = None) -> BagOutput:
        h, attention, _ = self.attend(x, mask)
        return BagOutput(self.head(self.pooled(h, attention)), attention)

    def tile_scores(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """a_i (W h_i) per tile (B, N, outputs); summed over a bag: its logits - b (no post)."""
        h, attention, _ = self.attend(x, mask)
        if self.post is not None:
            h = self.post(h)
        return attention[..., None] * (h @ self.head.weight.T)


def _from_trident(state: Mapping[str, Tensor]) -> ABMIL:
    enc = "feature_encoder.model."
    if f"{enc}image_pooler.attention_heads.1.0.weight" in state:
        raise ValueError("TRIDENT ABMIL with several attention heads: ours has one")
    rename = {
        f"{enc}pre_attention_layers.0.": "encoder.0.",
        f"{enc}image_pooler.attention_heads.0.0.": "attention.a.",
        f"{enc}image_pooler.gating_layers.0.0.": "attention.b.",
        f"{enc}image_pooler.branching_layers.0.": "attention.c.",
        f"{enc}post_attention_layers.0.": "post.0.",
        "classifier.": "head.",
    }
    return built(ABMIL, renamed(state, rename), activation="gelu", post=True)


def _from_clam(state: Mapping[str, Tensor]) -> ABMIL:
    ours = renamed(
        {k: v for k, v in state.items() if not k.startswith("instance_classifiers.")},
        clam_names(state),
    )
    return built(ABMIL, ours)


def built(cls: type, ours: Mapping[str, Tensor], **settings) -> nn.Module:
    """An attention model of class `cls` (ABMIL or one built on it) sized by the weights
    `ours` (named as ours are) and holding them, loaded strictly."""
    hidden, in_dim = ours["encoder.0.weight"].shape
    model = cls(
        in_dim,
        ours["head.weight"].shape[0],
        hidden=hidden,
        attention_dim=ours["attention.a.weight"].shape[0],
        gated="attention.b.weight" in ours,
        **settings,
    )
    model.load_state_dict(ours)
    return model


def clam_names(state: Mapping[str, Tensor]) -> dict[str, str]:
    """CLAM_SB's parameter prefixes -> ours (gated: attention_a/b/c; not: module.0 and the
    last Linear of `module`, after its Tanh and optional Dropout)."""
    net = "attention_net.3."
    names = {"attention_net.0.": "encoder.0.", "classifiers.": "head."}
    if f"{net}attention_a.0.weight" in state:
        names |= {
            f"{net}attention_a.0.": "attention.a.",
            f"{net}attention_b.0.": "attention.b.",
            f"{net}attention_c.": "attention.c.",
        }
    else:
        layers = [int(k.split(".")[3]) for k in state if k.startswith(f"{net}module.")]
        if not layers:
            raise ValueError(f"no {net}attention_a nor {net}module: not CLAM_SB's weights")
        names |= {f"{net}module.0.": "attention.a.", f"{net}module.{max(layers)}.": "attention.c."}
    return names


def renamed(state: Mapping[str, Tensor], rename: Mapping[str, str]) -> dict[str, Tensor]:
    """The state with each key's prefix renamed (a peer's names -> ours); a key no prefix
    names: refused."""
    out = {}
    for key, value in state.items():
        prefix = next((p for p in rename if key.startswith(p)), None)
        if prefix is None:
            raise ValueError(f"reference weight {key!r}: no counterpart in ours")
        out[rename[prefix] + key[len(prefix) :]] = value
    return out


REFERENCES = {"trident": _from_trident, "clam": _from_clam}


def from_reference(name: str, state_dict: Mapping[str, Tensor]) -> ABMIL:
    """Our ABMIL holding a reference implementation's weights ("trident" or "clam")."""
    if name not in REFERENCES:
        raise ValueError(f"no ABMIL reference {name!r}: known are {', '.join(REFERENCES)}")
    return REFERENCES[name](state_dict)
