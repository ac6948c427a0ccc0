"""A cohort's slide embeddings out as one table, a row per slide (slide, store, tiles, then
the features), for classifiers, survival models and retrieval: Parquet, CSV, or AnnData
.h5ad (X the features, obs the rest). The file's suffix says which (`WRITERS`). Patient
embeddings (`tilestore patients`) go out the same way, a row per patient (patient, slides,
n_slides, then the features; `write_patient_table`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import numpy as np

from tilestore.embeddings.recipe import ScaleLabel
from tilestore.errors import ExportError
from tilestore.exports.files import Exported
from tilestore.exports.options import SUFFIXES, Model, PlanName
from tilestore.options import Opt, checked


def slide_table(ds, *, features: bool = True):
    """A pandas DataFrame of slide embeddings (`open_slide_embeddings`): slide, store, tiles
    and, with `features`, a column f0, f1, ... per feature; of patient embeddings (a
    Dataset on patient, feature): patient, slides (their names, ";" between), n_slides."""
    import pandas as pd

    if "patient" in ds.dims:
        table = pd.DataFrame(
            {
                "patient": ds.patient.values,
                "slides": ds["slides"].values,
                "n_slides": ds["n_slides"].values.astype(np.int64),
            }
        )
    else:
        table = pd.DataFrame(
            {
                "slide": ds.slide.values,
                "store": ds.store.values,
                "tiles": ds["n_tiles"].values.astype(np.int64),
            }
        )
    if not features:
        return table
    values = pd.DataFrame(ds.features.values, columns=[f"f{i}" for i in range(ds.sizes["feature"])])
    return pd.concat([table, values], axis=1)


def _parquet(ds, path: Path) -> None:
    slide_table(ds).to_parquet(path, index=False)


def _csv(ds, path: Path) -> None:
    slide_table(ds).to_csv(path, index=False)


def _h5ad(ds, path: Path) -> None:
    import anndata

    rows = slide_table(ds, features=False)
    adata = anndata.AnnData(
        X=ds.features.values,
        obs=rows.set_index(rows.columns[0]),
        uns={k: v for k, v in ds.attrs.items() if isinstance(v, str)},
    )
    adata.write_h5ad(path)


# a slide table's file suffix -> what writes it
WRITERS: dict[str, Callable[..., None]] = dict(zip(SUFFIXES, (_parquet, _csv, _h5ad), strict=True))


def table_format(path: str | os.PathLike) -> str:
    """The suffix of a slide table's file (which says how it is written), or ExportError."""
    suffix = Path(path).suffix.lower()
    if suffix not in WRITERS:
        raise ExportError(f"{path}: write a {', '.join(SUFFIXES[:-1])} or {SUFFIXES[-1]} file")
    return suffix


def write_slide_table(ds, path: str | os.PathLike) -> Path:
    """Write slide embeddings (`open_slide_embeddings`) as the table its suffix says
    (.parquet, .csv, .h5ad); return the path."""
    path = Path(path)
    WRITERS[table_format(path)](ds, path)
    return path


@checked
def export_slides(
    stores: Annotated[list[str], Opt("Stores with slide embeddings, or a glob.")],
    *,
    model: Model,
    slide_encoder: Annotated[
        str, Opt("The slide encoder (see `tilestore models list`).", short="s")
    ],
    output: Annotated[
        Path, Opt("A .parquet, .csv or .h5ad (AnnData) file.", short="o", writes="file")
    ],
    skip_missing: Annotated[bool, Opt("Leave out stores without this slide embedding.")] = False,
    scale: ScaleLabel = None,
    plan: PlanName = None,
) -> Exported:
    """`tilestore export slides`: the cohort's slide embeddings (`open_slide_embeddings`),
    `write_slide_table`, and a line; a file type it does not write refused first.

    Columns: slide, store, tiles (how many tile features each vector was made from), then
    the features f0, f1, ... (in .h5ad: X, the rest as obs).
    """
    from tilestore.embeddings.slides import open_slide_embeddings

    table_format(output)  # a file type it does not write: refused before any store is read
    ds = open_slide_embeddings(
        stores, model, slide_encoder, skip_missing=skip_missing, scale=scale, plan=plan
    )
    write_slide_table(ds, output)
    return Exported((f"{ds.sizes['slide']} slide(s) x {ds.sizes['feature']} -> {output}",))
