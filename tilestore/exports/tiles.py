"""The analysis step the exports of tile embeddings share (QuPath, AnnData, maps): the stores
opened as one cohort and, where asked, the tiles' k-means clusters (fitted in their first
`pcs` principal components) and those components themselves (QuPath's measurements).
Computed here once, so every export clusters alike."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tilestore.analysis.options import PCS, OptionalClusters, OptionalComponents
from tilestore.embeddings.recipe import ScaleLabel
from tilestore.options import checked

if TYPE_CHECKING:
    import xarray as xr


@dataclass(frozen=True)
class TileAnalysis:
    """A cohort's tile embeddings (`ds`), their clusters (None where none were asked for)
    and their first principal components (None where not asked for, or `pcs` is None)."""

    ds: xr.Dataset
    clusters: xr.DataArray | None
    components: xr.DataArray | None


@checked
def analyse_tiles(
    stores: Sequence[str | os.PathLike],
    model: str,
    *,
    clusters: OptionalClusters = None,
    pcs: OptionalComponents = PCS,
    components: bool = False,
    skip_missing: bool = False,
    scale: ScaleLabel = None,
    plan: str | None = None,
) -> TileAnalysis:
    """The stores' embeddings of `model` (`tilestore.open_embeddings`: one population, or
    refused), with `clusters` k-means clusters of the tiles in their first `pcs` principal
    components (the features themselves where `pcs` is None) and, with `components`, those
    components (``ds.tiles.pca(pcs)``). Every export of tile embeddings analyses through
    this, so they cluster alike.

    Parameters
    ----------
    stores : list of str or path
        Stores, or glob patterns.
    model : str
        The model whose embeddings are read.
    clusters : int, optional
        k-means clusters to fit (None: none).
    pcs : int, optional
        Principal components the clusters are fitted in, and QuPath's measurements
        (None: the features themselves). Default `PCS`.
    components : bool
        Also return the first `pcs` components.
    skip_missing, scale, plan
        As `tilestore.open_embeddings` takes them.

    Returns
    -------
    TileAnalysis
        ``ds`` (the cohort's tiles), ``clusters`` and ``components`` (None where not asked).
    """
    from tilestore.embeddings import open_embeddings

    ds = open_embeddings(
        [str(s) for s in stores], model, skip_missing=skip_missing, scale=scale, plan=plan
    )
    found = ds.tiles.kmeans(clusters, pcs=pcs) if clusters else None
    measured = ds.tiles.pca(pcs) if components and pcs else None
    return TileAnalysis(ds, found, measured)
