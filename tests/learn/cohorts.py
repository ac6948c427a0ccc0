"""A small labelled cohort of real stores: copies of the embedded CMU-1-Small-Region store
(efficientnet-lite0 on the CPU, `embedded_cohort`), each a patient, labels alternating."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd

from tilestore.learn.options import LearnOptions

FAST = LearnOptions(device="cpu", epochs=2, patience=2, hidden=16, threads=1)


def copies(embedded_cohort, folder: Path, n: int = 6) -> tuple[list[Path], Path]:
    """`n` copies of the embedded CMU store as stores P0..P<n-1>, and a clinical table."""
    cmu = embedded_cohort[0]
    made = []
    for i in range(n):
        target = folder / f"P{i}.ome.zarr"
        shutil.copytree(cmu, target)
        made.append(target)
    table = folder / "clinical.csv"
    pd.DataFrame(
        {"PATIENT": [f"P{i}" for i in range(n)], "status": ["neg", "pos"] * (n // 2)}
    ).to_csv(table, index=False)
    return made, table
