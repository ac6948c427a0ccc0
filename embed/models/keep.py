"""KEEP's image tower (Zhou et al., knowledge-enhanced pathology vision-language model; weights
``Astaxanthin/KEEP``, code github.com/MAGIC-AI4Med/KEEP): timm's ViT-L/16 with layer scale,
its class token after the final norm, then the authors' ``visual_head`` (Linear, GELU,
Linear to the joint space) and an L2 normalisation: their ``KEEPModel.encode_image``
(``quick_start/keep_inference.py``, the Hub's ``modeling_keep.py``).

The Hub's checkpoint is the whole ``KEEPModel`` state: ``visual.*`` (timm's ViT),
``visual_head.*``, ``text.*`` (a BERT, `tilestore.embed.models.text`) and ``logit_scale``.
Its remote code renames timm's LayerScale parameter ``gamma`` to ``weight`` (transformers,
loading a checkpoint, renamed keys holding ``gamma``: huggingface/transformers#35615), so its
layer scales are ``visual.blocks.N.ls1.weight`` (STAMP's loader and raw2features' read them
so); a state saved from timm's own modules, as the authors' local quick start loads one,
keeps ``gamma``. Both load here.
"""

from __future__ import annotations

import re

import timm
import torch
import torch.nn.functional as F
from torch import nn

State = dict[str, torch.Tensor]

# the width of KEEP's joint space where a checkpoint's config.json does not say
PROJECTION_DIM = 768
_LAYER_SCALE = re.compile(r"^(visual\.blocks\.\d+\.ls[12])\.weight$")


class KeepImage(nn.Module):
    """KEEP's image tower as a backbone: ``forward_features`` the ViT's normalised tokens,
    ``project`` the authors' head and L2 normalisation of the class token. Attribute names
    are theirs, so their state dict's image half loads as it is."""

    def __init__(self, arch: str, projection_dim: int = PROJECTION_DIM, **kwargs: object):
        super().__init__()
        self.visual = timm.create_model(
            arch, pretrained=False, num_classes=0, global_pool="", **kwargs
        )
        width = self.visual.num_features
        self.visual_head = nn.Sequential(
            nn.Linear(width, projection_dim), nn.GELU(), nn.Linear(projection_dim, projection_dim)
        )
        self.num_prefix_tokens = self.visual.num_prefix_tokens

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.visual.forward_features(x)

    def project(self, cls: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.visual_head(cls), dim=-1)


def keep_state(state: State) -> State:
    """The image half of a whole KEEP state (``visual.*``, ``visual_head.*``), its layer
    scales named as timm names them (``gamma``)."""
    image = {k: v for k, v in state.items() if k.startswith(("visual.", "visual_head."))}
    return {_LAYER_SCALE.sub(r"\1.gamma", k): v for k, v in image.items()}
