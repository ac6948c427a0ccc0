"""Gated attention MIL (placeholder of learn-models' module)."""

from __future__ import annotations

import torch
from torch import nn

from tilestore.learn.models.base import BagOutput


class ABMIL(nn.Module):
    def __init__(self, in_dim, outputs, hidden=128, dropout=0.0):
        super().__init__()
        self.embed = nn.Sequential(nn.Linear(in_dim, hidden), nn.ReLU(), nn.Dropout(dropout))
        self.a = nn.Linear(hidden, hidden)
        self.b = nn.Linear(hidden, hidden)
        self.w = nn.Linear(hidden, 1)
        self.head = nn.Linear(hidden, outputs)

    def _scores(self, x, mask):
        h = self.embed(x)
        s = self.w(torch.tanh(self.a(h)) * torch.sigmoid(self.b(h))).squeeze(-1)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        return h, torch.softmax(s.float(), dim=1).to(h.dtype)

    def forward(self, x, mask=None):
        h, a = self._scores(x, mask)
        return BagOutput(self.head(torch.einsum("bn,bnd->bd", a, h)), a)

    def tile_scores(self, x, mask=None):
        h, a = self._scores(x, mask)
        return a.unsqueeze(-1) * self.head(h)
