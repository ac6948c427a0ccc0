"""A labelled cohort on real stores (CMU-1 and the IHC image embedded with efficientnet-lite0
on the CPU, copied under TCGA-like names for more slides): every row of the tables accounted
for in one exact line; each bad input of issue 65 that concerns tables or stores refused in
one line (a TilestoreError: exit 2) before anything is learnt."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import IHC, group_of
from tilestore.embeddings.groups import open_finished
from tilestore.embeddings.recipe import combine, parse_scale, recipe
from tilestore.errors import (
    LabelError,
    LabelTableError,
    MixedResults,
    TilestoreError,
    TilestoreWarning,
)
from tilestore.learn import Task, as_recipe, build_cohort, read_table
from tilestore.reading.opening import open_slide

MODEL = "efficientnet-lite0"
# patient -> its slides (store copies), the slide's source store: 0 CMU-1, 1 the IHC image
SLIDES = {
    "TCGA-AA-0001": {"TCGA-AA-0001-01Z-00-DX1": 0, "TCGA-AA-0001-01Z-00-DX2": 1},
    "TCGA-AA-0002": {"TCGA-AA-0002-01Z-00-DX1": 1},
    "TCGA-AA-0003": {"TCGA-AA-0003-01Z-00-DX1": 1, "TCGA-AA-0003-01Z-00-DX2": 1},
    "TCGA-AA-0004": {"TCGA-AA-0004-01Z-00-DX1": 0},
    "TCGA-AA-0005": {"TCGA-AA-0005-01Z-00-DX1": 1},
    "TCGA-AA-0006": {"TCGA-AA-0006-01Z-00-DX1": 1},
    "TCGA-AA-0009": {"TCGA-AA-0009-01Z-00-DX1": 1},  # no clinical row: "missing label"
}
NOT_EMBEDDED = "TCGA-AA-0007-01Z-00-DX1"  # a store without embeddings: "no embeddings"
MSI = {
    "TCGA-AA-0001": "MSI-H",
    "TCGA-AA-0002": "MSS",
    "TCGA-AA-0003": "MSI-H",
    "TCGA-AA-0004": "MSS",
    "TCGA-AA-0005": "MSI-H",
    "TCGA-AA-0006": "MSS",
    "TCGA-AA-0007": "MSS",
    "TCGA-AA-0008": "MSI-H",
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory, embedded_cohort, stores):
    """The cohort's stores: copies of the two embedded stores, and a store not embedded."""
    root = tmp_path_factory.mktemp("learn") / "stores"
    root.mkdir()
    for slides in SLIDES.values():
        for name, source in slides.items():
            shutil.copytree(embedded_cohort[source], root / f"{name}.ome.zarr")
    shutil.copytree(stores(IHC, mpp=0.5), root / f"{NOT_EMBEDDED}.ome.zarr")
    return root


def _clinical(tmp_path: Path, rows: dict | None = None, name: str = "clinical.csv", **extra):
    table = pd.DataFrame({"PATIENT": list(MSI), "MSI": list((rows or MSI).values()), **extra})
    path = tmp_path / name
    table.to_csv(path, index=False, sep="\t" if name.endswith(".tsv") else ",")
    return path


def _slide_table(tmp_path: Path) -> Path:
    names = [(s, p) for p, slides in SLIDES.items() if p != "TCGA-AA-0009" for s in slides]
    names += [(NOT_EMBEDDED, "TCGA-AA-0007"), ("TCGA-AA-0008-01Z-00-DX1.ome.zarr", "TCGA-AA-0008")]
    path = tmp_path / "slides.csv"
    pd.DataFrame(names, columns=["FILENAME", "PATIENT"]).to_csv(path, index=False)
    return path


def test_a_tcga_cohort_accounts_for_every_row_in_one_line(folder, tmp_path):
    cohort = build_cohort(_clinical(tmp_path), folder, MODEL, targets="MSI", patient_from="tcga")
    assert cohort.summary() == (
        "6 patients used (8 slides); 2 no slide used; 1 no embeddings; 1 missing label"
    )
    assert cohort.task == Task("classification", ("MSI",), (("MSI-H", "MSS"),))
    assert cohort.task.outputs == 2 and cohort.task.heads() == [slice(0, 2)]
    assert cohort.patients == tuple(f"TCGA-AA-000{i}" for i in range(1, 7))
    assert cohort.labels.tolist() == [[0.0], [1.0], [0.0], [1.0], [0.0], [1.0]]
    assert [s.slide for s in cohort.slides] == [
        s for p in cohort.patients for s in sorted(SLIDES[p])
    ]
    assert cohort.slides_of("TCGA-AA-0003") == (3, 4)
    assert all(Path(s.store).name == f"{s.slide}.ome.zarr" for s in cohort.slides)
    status = {(r.source, Path(r.key).name): r.status for r in cohort.rows}
    assert status[("store", f"{NOT_EMBEDDED}.ome.zarr")] == "no embeddings"
    assert status[("store", "TCGA-AA-0009-01Z-00-DX1.ome.zarr")] == "missing label"
    assert (
        status[("clinical", "TCGA-AA-0007")]
        == status[("clinical", "TCGA-AA-0008")]
        == ("no slide used")
    )
    assert len(cohort.rows) == 8 + 10  # every clinical row and every store
    # the recipe: what the features are, to be compared again at predict
    assert cohort.recipe["facts"]["name"] == MODEL
    assert as_recipe(cohort.recipe).scale.matches(parse_scale("0.5mpp-224px"))
    # written into a run as JSON, read back and compared with new stores by `combine`
    written = as_recipe(json.loads(json.dumps(cohort.recipe)))
    store = cohort.slides[0].store
    assert combine([("run", written), (store, recipe(open_finished(store, MODEL).meta))], "x")


def test_a_slide_table_links_slides_and_counts_its_rows(folder, tmp_path):
    cohort = build_cohort(
        _clinical(tmp_path),
        sorted(folder.glob("*.ome.zarr")),
        MODEL,
        targets="MSI",
        slides=_slide_table(tmp_path),
    )
    assert cohort.summary() == (
        "6 patients used (8 slides); 2 no slide used; 1 no store; 1 no embeddings; 1 no patient"
    )
    by_key = {r.key: r for r in cohort.rows}
    assert by_key["TCGA-AA-0008-01Z-00-DX1.ome.zarr"].status == "no store"
    assert "slides.csv, row 11" in by_key["TCGA-AA-0008-01Z-00-DX1.ome.zarr"].reason


def test_patients_by_a_regex_and_tables_of_every_suffix(folder, tmp_path):
    clinical = pd.read_csv(_clinical(tmp_path))
    clinical.to_parquet(tmp_path / "c.parquet")
    for path in (tmp_path / "c.parquet", _clinical(tmp_path, name="c.tsv")):
        cohort = build_cohort(
            path, str(folder / "*.ome.zarr"), MODEL, targets="MSI", patient_from=r"^(.{12})-01Z"
        )
        assert len(cohort.patients) == 6
    assert read_table(tmp_path / "c.parquet").equals(clinical)


def test_without_a_rule_each_slide_is_its_patient(folder, tmp_path):
    names = [s for slides in SLIDES.values() for s in slides]
    table = pd.DataFrame({"PATIENT": names, "y": np.arange(len(names)) * 1.5})
    cohort = build_cohort(table, folder, MODEL, targets="y", kind="regression")
    assert cohort.patients == tuple(sorted(names))
    assert cohort.task == Task("regression", ("y",)) and cohort.task.outputs == 1
    assert cohort.summary() == "9 patients used (9 slides); 1 no embeddings"
    assert sorted(cohort.labels[:, 0]) == sorted(table["y"])


def test_survival_labels_are_time_and_event(folder, tmp_path):
    table = pd.DataFrame(
        {"PATIENT": list(MSI), "OS": [5.0, 3, 8, 1, 2, 9, 4, 7], "DEAD": [1, 0, 1, 1, 0, 1, 0, 0]}
    )
    cohort = build_cohort(
        table, folder, MODEL, kind="survival", time="OS", event="DEAD", patient_from="tcga"
    )
    assert cohort.task == Task("survival", ("OS", "DEAD")) and cohort.task.outputs == 1
    assert cohort.labels.tolist() == [[5, 1], [3, 0], [8, 1], [1, 1], [2, 0], [9, 1]]


def test_categories_keep_some_classes(folder, tmp_path):
    labels = {**MSI, "TCGA-AA-0006": "POLE"}
    cohort = build_cohort(
        _clinical(tmp_path, labels),
        folder,
        MODEL,
        targets="MSI",
        patient_from="tcga",
        categories=["MSS", "MSI-H"],
    )
    assert cohort.task.classes == (("MSI-H", "MSS"),)
    assert "TCGA-AA-0006" not in cohort.patients
    assert cohort.summary() == (
        "5 patients used (7 slides); 2 no slide used; 2 other class; 1 no embeddings; "
        "1 missing label"
    )


def test_several_targets_at_once(folder, tmp_path):
    path = _clinical(tmp_path, GRADE=["1", "2", "3", "1", "2", "3", "1", "2"])
    cohort = build_cohort(path, folder, MODEL, targets=["MSI", "GRADE"], patient_from="tcga")
    assert cohort.task.classes == (("MSI-H", "MSS"), ("1", "2", "3"))
    assert cohort.task.outputs == 5 and cohort.task.heads() == [slice(0, 2), slice(2, 5)]
    assert cohort.labels[:, 1].tolist() == [0, 1, 2, 0, 1, 2]


# ---- bad input: one line, a TilestoreError (exit 2), before anything is learnt ----


def _refused(error, match, *args, **kwargs):
    with pytest.raises(error, match=match) as refused:
        build_cohort(*args, **kwargs)
    assert "\n" not in str(refused.value) and isinstance(refused.value, TilestoreError)
    return str(refused.value)


def test_a_missing_column_is_named_with_the_file(folder, tmp_path):
    path = _clinical(tmp_path)
    _refused(
        LabelTableError,
        r"clinical.csv: no column 'KRAS' \(its columns: PATIENT, MSI\)",
        path,
        folder,
        MODEL,
        targets="KRAS",
        patient_from="tcga",
    )
    _refused(
        LabelTableError,
        r"clinical.csv: no column 'CASE'",
        path,
        folder,
        MODEL,
        targets="MSI",
        patient="CASE",
    )
    slides = tmp_path / "s.csv"
    pd.DataFrame({"SLIDE": ["a"], "PATIENT": ["TCGA-AA-0001"]}).to_csv(slides, index=False)
    _refused(
        LabelTableError,
        r"s.csv: no column 'FILENAME'",
        path,
        folder,
        MODEL,
        targets="MSI",
        slides=slides,
    )


def test_labels_of_one_class_are_refused(folder, tmp_path):
    path = _clinical(tmp_path, dict.fromkeys(MSI, "MSS"))
    _refused(
        LabelError,
        r"'MSI' has one class \('MSS'\) among the 6 patients with slides",
        path,
        folder,
        MODEL,
        targets="MSI",
        patient_from="tcga",
    )


def test_nan_labels_are_refused_naming_the_row(folder, tmp_path):
    path = _clinical(tmp_path, {**MSI, "TCGA-AA-0003": None})
    _refused(
        LabelError,
        r"clinical.csv, row 4: patient 'TCGA-AA-0003' has no 'MSI' \(empty or NaN\)",
        path,
        folder,
        MODEL,
        targets="MSI",
        patient_from="tcga",
    )
    table = pd.DataFrame({"PATIENT": list(MSI), "y": [1.0, np.nan, 2, 3, 4, 5, 6, 7]})
    _refused(
        LabelError,
        r"row 3: patient 'TCGA-AA-0002' has no 'y'",
        table,
        folder,
        MODEL,
        targets="y",
        kind="regression",
        patient_from="tcga",
    )


def test_a_patient_with_no_slides_is_refused(folder, tmp_path):
    path = _clinical(tmp_path)
    table = pd.read_csv(_slide_table(tmp_path))
    table = table[table["PATIENT"] != "TCGA-AA-0005"]
    table.to_csv(tmp_path / "slides.csv", index=False)
    _refused(
        LabelError,
        r"patient 'TCGA-AA-0005' has no slides in .*slides.csv",
        path,
        folder,
        MODEL,
        targets="MSI",
        slides=tmp_path / "slides.csv",
    )


@pytest.mark.parametrize(
    ("times", "events", "match"),
    [
        ([5.0, 3, 0, 1, 2, 9, 4, 7], [1] * 8, r"'TCGA-AA-0003' has OS=0: survival times must be"),
        ([5.0, 3, 8, -1, 2, 9, 4, 7], [1] * 8, r"'TCGA-AA-0004' has OS=-1: survival times"),
        ([5.0] * 8, [1, 0, 2, 1, 0, 1, 0, 0], r"'TCGA-AA-0003' has DEAD=2: events are 0 or 1"),
        ([5.0] * 8, [0] * 8, r"'DEAD' has no event"),
    ],
)
def test_survival_times_and_events_are_checked(folder, times, events, match):
    table = pd.DataFrame({"PATIENT": list(MSI), "OS": times, "DEAD": events})
    _refused(
        LabelError,
        match,
        table,
        folder,
        MODEL,
        kind="survival",
        time="OS",
        event="DEAD",
        patient_from="tcga",
    )


def _copy(embedded_cohort, into: Path, names: list[str]) -> list[Path]:
    into.mkdir(parents=True, exist_ok=True)
    out = []
    for name in names:
        shutil.copytree(embedded_cohort[1], into / f"{name}.ome.zarr")
        out.append(into / f"{name}.ome.zarr")
    return out


def _edit(store: Path, change) -> None:
    group = open_slide(store).writable_group()[group_of(store, MODEL)]
    attrs = dict(group.attrs["tilestore"])
    change(attrs)
    group.attrs["tilestore"] = attrs


def test_stores_of_mixed_models_or_scales_are_refused(embedded_cohort, tmp_path):
    names = ["TCGA-AA-0001-01Z-00-DX1", "TCGA-AA-0002-01Z-00-DX1"]
    table = pd.DataFrame({"PATIENT": ["TCGA-AA-0001", "TCGA-AA-0002"], "MSI": ["MSS", "MSI-H"]})
    models = _copy(embedded_cohort, tmp_path / "models", names)
    assert len(build_cohort(table, models, MODEL, targets="MSI", patient_from="tcga").slides) == 2
    _edit(models[1], lambda a: a.update(model={**a["model"], "weights_sha256": "b" * 64}))
    _refused(
        MixedResults,
        r"DX1.ome.zarr: its 'efficientnet-lite0' embeddings were made with "
        r"other settings .*weights_sha256",
        table,
        models,
        MODEL,
        targets="MSI",
        patient_from="tcga",
    )
    scales = _copy(embedded_cohort, tmp_path / "scales", names)
    _edit(scales[1], lambda a: a.update(mpp=1.0))
    _refused(
        MixedResults,
        r"more than one scale \(0.5-1mpp-224px: 2 store\(s\)",
        table,
        scales,
        MODEL,
        targets="MSI",
        patient_from="tcga",
    )
    # naming the scale keeps one: here a single patient, so nothing to learn, said in one line
    with pytest.warns(TilestoreWarning, match=r"left out 1 store\(s\) .* not at 0.5mpp-224px"):
        message = _refused(
            LabelError,
            r"'MSI' has one class",
            table,
            scales,
            MODEL,
            targets="MSI",
            patient_from="tcga",
            scale="0.5mpp-224px",
        )
    assert "among the 1 patients" in message


def test_no_stores_and_unreadable_tables_are_refused(folder, tmp_path):
    path = _clinical(tmp_path)
    _refused(LabelError, r"no stores given", path, [], MODEL, targets="MSI")
    empty = tmp_path / "empty"
    empty.mkdir()
    _refused(
        LabelError,
        r"empty: no stores \(\*.ome.zarr\) in this folder",
        path,
        empty,
        MODEL,
        targets="MSI",
    )
    (tmp_path / "c.json").write_text("{}")
    _refused(
        LabelTableError,
        r"c.json: a table is a .csv, .tsv",
        tmp_path / "c.json",
        folder,
        MODEL,
        targets="MSI",
    )
    _refused(
        LabelTableError,
        r"nope.csv: no such table",
        tmp_path / "nope.csv",
        folder,
        MODEL,
        targets="MSI",
    )
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    _refused(
        LabelTableError,
        r"bad.parquet: cannot be read as a table",
        tmp_path / "bad.parquet",
        folder,
        MODEL,
        targets="MSI",
    )
    twice = pd.DataFrame({"PATIENT": ["a", "b", "a"], "MSI": ["MSS", "MSI-H", "MSS"]})
    _refused(
        LabelTableError, r"row 4: patient 'a' again \(row 2\)", twice, folder, MODEL, targets="MSI"
    )


def test_no_patient_left_says_where_they_went(folder, tmp_path):
    table = pd.DataFrame({"PATIENT": ["X1", "X2"], "MSI": ["MSS", "MSI-H"]})
    _refused(
        LabelError,
        r"no patient left to learn from \(2 no slide used; 1 no embeddings; "
        r"9 missing label\)",
        table,
        folder,
        MODEL,
        targets="MSI",
        patient_from="tcga",
    )


def test_building_a_cohort_does_not_import_torch(folder, tmp_path):
    import subprocess

    code = (
        "import sys, tilestore.learn as L\n"
        f"c = L.build_cohort({str(_clinical(tmp_path))!r}, {str(folder)!r}, {MODEL!r}, "
        "targets='MSI', patient_from='tcga')\n"
        "L.make_splits(c, k=2); print(c.summary(), 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().endswith("False")


def test_an_excel_table_is_read_or_refused_in_one_line(tmp_path):
    path = tmp_path / "c.xlsx"
    table = pd.DataFrame({"PATIENT": ["a", "b"], "MSI": ["MSS", "MSI-H"]})
    try:
        import openpyxl  # noqa: F401
    except ImportError:  # pandas reads Excel with openpyxl: without it, one line says so
        path.write_bytes(b"PK")
        with pytest.raises(LabelTableError, match=r"c.xlsx: cannot be read"):
            read_table(path)
        return
    table.to_excel(path, index=False)
    assert read_table(path).equals(table)


def test_a_cohort_of_slide_vectors_reads_the_encoders_vectors(embedded_cohort, tmp_path):
    from tilestore.embeddings.slides import read_tile_features, write_slide_vector

    names = ["TCGA-AA-0001-01Z-00-DX1", "TCGA-AA-0002-01Z-00-DX1", "TCGA-AA-0003-01Z-00-DX1"]
    made = _copy(embedded_cohort, tmp_path / "vectors", names)
    for store in made[:2]:  # the third has tile features only
        tiles = read_tile_features(store, MODEL)
        write_slide_vector(tiles, "mean-pool", tiles.features.mean(axis=0),
                           {"encoder": "mean-pool", "pooling": "mean"})  # fmt: skip
    table = pd.DataFrame({"PATIENT": [n[:12] for n in names], "MSI": ["MSS", "MSI-H", "MSS"]})
    cohort = build_cohort(
        table, made, MODEL, targets="MSI", patient_from="tcga", slide_encoder="mean-pool"
    )
    assert cohort.slide_encoder == "mean-pool" and cohort.recipe["slide_encoder"] == "mean-pool"
    assert [s.slide for s in cohort.slides] == names[:2]
    assert cohort.summary() == "2 patients used (2 slides); 1 no slide used; 1 no embeddings"
    assert any(k.startswith("encoder ") for k in cohort.recipe["facts"])
