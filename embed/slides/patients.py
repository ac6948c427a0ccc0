"""Patient embeddings: a patient's slides' stored vectors through the encoder's own patient
model (MOOZY's case transformer), or the tiles of all its slides through the encoder at once
(EAGLE, as STAMP's), one vector per patient, written as a table.

The slides are grouped by a table the user gives (CSV or TSV, columns ``slide`` and
``patient``; a slide is named as `tilestore export slides` names it: its store's name
without .ome.zarr). The table is checked whole before anything is read: a column missing,
a row without a slide or patient, a slide listed twice or in two patients is one line
naming the file, the row and the cause. Then the stores' slide vectors are opened together
(`open_slide_embeddings`: made alike, with one encoder's weights, at one scale, or refused),
every slide of the table must be among them and every one of them in the table; the
encoder is loaded with the weights its slide vectors record (others are refused), and each
patient's vector is computed from its slides' vectors. Nothing is written into the stores:
a patient spans stores, so its vectors go to one file, a row per patient, as the slide
table's (.parquet, .csv, .h5ad).

    embed_patients(stores, "patients.csv", "patients.parquet")   # MOOZY by default
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tilestore.embed.settings import Device, resolve_device
from tilestore.embed.slides.load import AUTOCAST, load_slide_encoder
from tilestore.embed.slides.registry import get_slide_encoder, list_slide_encoders, tile_model_for
from tilestore.embed.slides.run import precision_for
from tilestore.embed.slides.spec import SlidePrecision
from tilestore.embeddings.slides import (
    open_slide_embeddings,
    read_slide_vector,
    read_tile_features,
)
from tilestore.errors import OutputError, PatientTableError, SlideEncoderError
from tilestore.exports.slidetable import table_format, write_slide_table
from tilestore.options import checked
from tilestore.urls import written_here

COLUMNS = ("slide", "patient")
DELIMITERS = {".csv": ",", ".tsv": "\t", ".txt": "\t"}


@dataclass(frozen=True)
class PatientTable:
    """A checked table: each patient's slides, in the table's order; where each slide is."""

    path: Path
    patients: dict[str, list[str]]
    rows: dict[str, int]  # slide -> its row (the file's line number)

    def check_slides(self, slides: Sequence[str], stores: Sequence[str]) -> None:
        """Every slide of the table among `slides` (the stores' names), and every one of
        them in the table; else one line naming the file and the row or the store."""
        given = set(slides)
        for slide, row in self.rows.items():
            if slide not in given:
                raise PatientTableError(
                    f"{self.path}, row {row}: slide {slide!r} is not among the {len(given)} "
                    "store(s) given (a slide is its store's name without .ome.zarr)"
                )
        for slide, store in zip(slides, stores, strict=True):
            if slide not in self.rows:
                raise PatientTableError(
                    f"{self.path}: no patient for slide {slide!r} ({store}): add it to the "
                    "table or leave its store out"
                )


def read_patient_table(path: str | os.PathLike) -> PatientTable:
    """Read and check a table of slides and their patients (see the module's docstring)."""
    path = Path(path)
    delimiter = DELIMITERS.get(path.suffix.lower())
    if delimiter is None:
        raise PatientTableError(f"{path}: a patient table is a .csv or .tsv file")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError as exc:
        raise PatientTableError(f"{path}: no such patient table") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise PatientTableError(f"{path}: cannot be read as text ({exc})") from exc
    reader = csv.DictReader(text.splitlines(), delimiter=delimiter)
    header = [c.strip() for c in reader.fieldnames or []]
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise PatientTableError(
            f"{path}: no {' and no '.join(repr(c) for c in missing)} column (its header: "
            f"{', '.join(header) or 'none'}); a patient table has the columns slide and patient"
        )
    reader.fieldnames = header
    patients: dict[str, list[str]] = {}
    rows: dict[str, int] = {}
    owner: dict[str, str] = {}
    for line, record in enumerate(reader, start=2):
        slide, patient = ((record.get(c) or "").strip() for c in COLUMNS)
        if not slide or not patient:
            raise PatientTableError(f"{path}, row {line}: no {'slide' if not slide else 'patient'}")
        if slide in rows:
            where = "again" if owner[slide] == patient else f"in patient {patient!r} too"
            raise PatientTableError(
                f"{path}, row {line}: slide {slide!r} is in patient {owner[slide]!r} (row "
                f"{rows[slide]}) and {where}: a slide belongs to one patient, once"
            )
        rows[slide], owner[slide] = line, patient
        patients.setdefault(patient, []).append(slide)
    if not patients:
        raise PatientTableError(f"{path}: no rows under its header")
    return PatientTable(path, patients, rows)


@dataclass
class PatientReport:
    encoder: str
    model: str
    device: str
    precision: str
    weights: str
    patients: int
    slides: int
    output: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@checked
def embed_patients(
    stores: Sequence[str | os.PathLike],
    table: str | os.PathLike,
    output: str | os.PathLike,
    *,
    encoder: str = "moozy",
    model: str | None = None,
    device: Device = "auto",
    precision: SlidePrecision = "auto",
    token: str | None = None,
    weights: str | os.PathLike | None = None,
    overwrite: bool = False,
) -> PatientReport:
    """Compute a vector per patient of `table` from its slides' `encoder` vectors in
    `stores` (EAGLE: from their tiles, all at once) and write them to `output` (.parquet,
    .csv or .h5ad: a row per patient: patient, slides, n_slides, f0, f1, ...). The encoder
    must define patient vectors
    (MOOZY, EAGLE); its slide vectors must be in the stores (`embed_slides`). precision "auto":
    the authors' on CUDA, fp32 on the CPU. Refused before anything is computed: an output
    of another type or that exists (unless overwrite), a table that does not check, slides
    and stores that do not match it, slide vectors made differently."""
    spec = get_slide_encoder(encoder)
    if not spec.patients:
        able = [s.name for s in list_slide_encoders() if s.patients]
        raise SlideEncoderError(
            f"encoder={spec.name!r} makes no patient vectors; {', '.join(able)} "
            + ("does" if len(able) == 1 else "do")
        )
    output = written_here(output, "output")
    table_format(output)
    if output.exists() and not overwrite:
        raise OutputError(f"{output} exists: pass overwrite=True to replace it")
    checked_table = read_patient_table(table)
    tile_model = tile_model_for(spec, model)
    ds = open_slide_embeddings(stores, tile_model, spec.name)
    checked_table.check_slides([str(s) for s in ds.slide.values], [str(s) for s in ds.store.values])
    dev, _ = resolve_device(device, "fp32")
    run_precision = precision_for(spec, precision, dev)
    loaded = load_slide_encoder(spec, token=token, weights=weights, device=dev)
    made = ds.attrs["encoder_info"]
    if (made.get("weights"), made.get("revision")) != (loaded.weights, loaded.revision):
        raise SlideEncoderError(
            f"the slide vectors were made with {spec.name} weights {made.get('weights')} "
            f"(revision {made.get('revision')}), these are {loaded.weights} (revision "
            f"{loaded.revision}): a patient's vector needs the weights its slides' were made with"
        )
    made_from = PATIENTS_FROM[getattr(loaded.module, "patients_from", "slides")]
    vectors = made_from(loaded, ds, checked_table, dev, run_precision, tile_model)
    write_slide_table(_dataset(ds, checked_table, vectors, loaded.describe(run_precision)), output)
    return PatientReport(
        spec.name, tile_model, str(dev), run_precision, loaded.weights,
        len(checked_table.patients), ds.sizes["slide"], str(output),
    )  # fmt: skip


@torch.inference_mode()
def _from_slide_vectors(
    loaded, ds, table: PatientTable, device, precision: str, tile_model: str
) -> np.ndarray:
    """Each patient's vector from its slides' vectors (MOOZY's case transformer)."""
    index = {str(name): i for i, name in enumerate(ds.slide.values)}
    features = torch.from_numpy(np.asarray(ds.features.values, dtype=np.float32)).to(device)
    dtype = AUTOCAST.get(precision)
    out = []
    for slides in table.patients.values():
        rows = torch.tensor([index[s] for s in slides], device=device)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            out.append(loaded.module.patient(features[rows]).float().cpu().numpy())
    return np.stack(out)


def _from_tiles(
    loaded, ds, table: PatientTable, device, precision: str, tile_model: str
) -> np.ndarray:
    """Each patient's vector from the tiles of all its slides at once (EAGLE, as STAMP's
    encode_patients: its slides' tile features and guide features, each in the table's
    order of its slides, through the slide encoder). Each slide's tiles are those its slide
    vector was made from (its record's plan)."""
    store_of = {str(n): str(s) for n, s in zip(ds.slide.values, ds.store.values, strict=True)}
    spec, out = loaded.spec, []
    for slides in table.patients.values():
        parts = [_slide_tiles(store_of[s], spec, tile_model) for s in slides]
        tiles, guide = (_joined([p[k] for p in parts]) for k in (0, 1))
        out.append(loaded.encode(tiles, device, precision, guide))
    return np.stack(out)


def _joined(parts: list) -> object:
    """Several slides' tile features as one bag: their rows one slide after another."""
    rows = ("features", "x", "y", "row", "col")
    return replace(parts[0], **{k: np.concatenate([getattr(p, k) for p in parts]) for k in rows})


def _slide_tiles(store: str, spec, tile_model: str) -> tuple:
    """A slide's tile features and guide features, of the plans its vector records."""
    record = read_slide_vector(store, tile_model, spec.name)["record"]
    tiles = read_tile_features(store, tile_model, record["tiles"]["plan"])
    guide = read_tile_features(store, spec.guide, record["guide"]["plan"])
    return tiles, guide


# how a patient's vector is made, by its module's `patients_from`
PATIENTS_FROM = {"slides": _from_slide_vectors, "tiles": _from_tiles}


def _dataset(ds, table: PatientTable, vectors: np.ndarray, encoder: dict[str, Any]):
    import xarray as xr

    return xr.Dataset(
        {"features": (("patient", "feature"), vectors)},
        coords={
            "patient": list(table.patients),
            "slides": ("patient", [";".join(s) for s in table.patients.values()]),
            "n_slides": ("patient", [len(s) for s in table.patients.values()]),
        },
        attrs={
            "model": ds.attrs["model"],
            "slide_encoder": ds.attrs["slide_encoder"],
            "weights": str(encoder["weights"]),
            "precision": encoder["precision"],
        },
    )
