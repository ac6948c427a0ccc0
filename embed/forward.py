"""The model on its device as the GPU loop runs it: a batch of uint8 tiles in, features out.

`Forward` applies the model's transform and the model under inference mode and, in bf16,
autocast. Compiled, the transform is fused with the model's first layers (uint8 in, no
float32 copy of the batch in between). On a GPU, compiled or not, the whole batch buffer goes
through, the last batch padded (every batch one shape: a tile's features do not depend on how
many tiles share its batch), as one CUDA graph replay (`tilestore.embed.graphs`) where the
model can be captured, else run as it is (the report says why).
Batch sizes are chosen in `tilestore.embed.sizing`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from tilestore.embed.graphs import GraphedForward
from tilestore.embed.models import LoadedModel, ModelError
from tilestore.embed.settings import Precision
from tilestore.errors import OptionError
from tilestore.qc.tilewise import MEASURES, TileParams, TileTables, tile_measures


def place(loaded: LoadedModel, device: torch.device) -> LoadedModel:
    """Move the model to `device` for inference (channels-last on CUDA); return it."""
    loaded.module.to(device).eval()
    if device.type == "cuda":
        loaded.module.to(memory_format=torch.channels_last)
    return loaded


@dataclass(frozen=True)
class TokenLayout:
    """The patch tokens a run stores beside the features: a grid x grid average of the
    model's own grid (model_grid, of dim-wide tokens)."""

    grid: int
    dim: int
    model_grid: tuple[int, int]

    @property
    def width(self) -> int:
        """Values per tile, flattened after the features in each output row."""
        return self.grid * self.grid * self.dim

    def record(self) -> dict:
        return {"grid": [self.grid, self.grid], "dim": self.dim,
                "model_grid": list(self.model_grid), "pooling": "mean"}  # fmt: skip


def token_layout(
    loaded: LoadedModel, device: torch.device, grid: int | Literal["model"]
) -> TokenLayout:
    """The token grid a model makes (one probe tile) and the grid asked for ("model": the
    model's own); a grid finer than the model's is refused."""
    size = loaded.transform.input_size
    try:
        with torch.inference_mode():
            tokens = loaded.module.tokens(torch.zeros(1, 3, size, size, device=device))
    except (ValueError, AttributeError) as exc:
        raise ModelError(f"{loaded.spec.name}: no patch tokens to store ({exc})") from exc
    rows, cols, dim = tokens.shape[1:]
    if grid == "model":
        return TokenLayout(rows, dim, (rows, cols))
    if grid > min(rows, cols):
        raise OptionError(
            f"tokens={grid}: {loaded.spec.name} makes a {rows} x {cols} token grid; "
            f"ask for at most {min(rows, cols)} ('model': its own grid)"
        )
    return TokenLayout(grid, dim, (rows, cols))


@dataclass(frozen=True)
class QualityLayout:
    """The per-tile quality measures a run stores (`tilestore.qc.tilewise`): taken on each
    tile as `side` px at `mpp` um/px (the model's tile and resolution: what its plans read;
    a footprint read at a finer level is brought to `side` first, as the model sees it)."""

    mpp: float
    side: int
    measures: tuple[str, ...] = MEASURES

    @property
    def width(self) -> int:
        return len(self.measures)

    def record(self) -> dict:
        return {"measures": list(self.measures), "mpp": self.mpp, "side": self.side,
                "params": asdict(TileParams())}  # fmt: skip

    def tables(self, device: torch.device) -> TileTables:
        """The measures' constants on `device`, made once per run (not every batch)."""
        return TileTables.on(device, (self.side, self.side), self.mpp)

    def measure(self, tiles: torch.Tensor, tables: TileTables | None = None) -> torch.Tensor:
        """(n, width) float32 measures of (n, h, w, 3) uint8 tiles on their device (`tables`:
        from `tables`, made once per run)."""
        if tiles.shape[1:3] != (self.side, self.side):  # decided when a graph is traced
            scaled = F.interpolate(
                tiles.permute(0, 3, 1, 2).float(), size=(self.side, self.side),
                mode="bilinear", antialias=True, align_corners=False,
            )  # fmt: skip
            tiles = scaled.round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1)
        return tile_measures(tiles, self.mpp, tables=tables)


class Forward:
    """Features of batches of (n, h, w, c) uint8 tiles on the model's device; with `tokens`,
    each row is the features then the tile's pooled patch-token grid, flattened; with
    `quality`, then the tile's quality measures, computed from the same uint8 tiles in the
    same pass (in float32, outside autocast)."""

    def __init__(
        self,
        loaded: LoadedModel,
        device: torch.device,
        precision: Precision,
        compile: bool,
        tokens: TokenLayout | None = None,
        quality: QualityLayout | None = None,
        graphs: bool = True,
    ) -> None:
        self.loaded, self.device, self.precision = loaded, device, precision
        self.tokens, self.quality = tokens, quality
        self.tables = quality.tables(device) if quality else None  # not made every batch
        self.width = (
            loaded.output_dim + (tokens.width if tokens else 0) + (quality.width if quality else 0)
        )
        # the whole buffer goes through this (None: the model as it is, on the tiles given)
        self.whole: GraphedForward | Callable | None = None
        if compile:
            loaded.transform.prepare(device)  # not inside the first compiled call
        run = torch.compile(self._eager) if compile else self._eager
        if device.type == "cuda" and graphs:
            self.whole = GraphedForward(run)
        elif compile:
            self.whole = run

    def _eager(self, tiles: torch.Tensor) -> torch.Tensor:
        x = self.loaded.transform(tiles)
        if self.tokens is None:
            out = self.loaded.features(x)
        else:
            out = self.loaded.module.features_and_tokens(x, self.tokens.grid)
        if self.quality is None:
            return out
        with torch.autocast(self.device.type, enabled=False):
            measures = self.quality.measure(tiles, self.tables)
        return torch.cat([out.float(), measures], dim=1)  # the measures as computed

    @property
    def stored_width(self) -> int:
        """The columns of a row stored in the run's dtype (the features, then the tokens):
        the quality measures after them are float32, NaN where a measure does not judge."""
        return self.width - (self.quality.width if self.quality else 0)

    def row_dtype(self, stored: torch.dtype) -> torch.dtype:
        """The dtype of the rows the host receives, for features stored as `stored`: float32
        where the measures ride along (not rounded to the features' 3 digits of float16)."""
        return torch.float32 if self.quality else stored

    @property
    def graph_note(self) -> str | None:
        """Why batches are not replayed as CUDA graphs on a GPU (None: they are, or the
        run is on the CPU)."""
        failed = getattr(self.whole, "failed", None)
        return None if failed is None else f"{self.loaded.spec.name}: {failed}; run as it is"

    def __call__(self, tiles: torch.Tensor, count: int) -> torch.Tensor:
        """Features of the first `count` tiles of a batch buffer (on the device).

        On a GPU (unless made with graphs=False), or compiled, the whole buffer goes through
        (one graph for every batch, the last one padded); else the model runs on the
        `count` tiles.
        """
        if self.whole is None:
            tiles = tiles[:count]
        forward = self._eager if self.whole is None else self.whole
        autocast = (
            torch.autocast(self.device.type, dtype=torch.bfloat16)
            if self.precision == "bf16"
            else contextlib.nullcontext()
        )
        with torch.inference_mode(), autocast:
            return forward(tiles)[:count]
