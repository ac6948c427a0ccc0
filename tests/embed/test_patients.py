"""MOOZY and patient embeddings: its slide encoder and case transformer equal their authors'
arithmetic written out plainly; a patient table is checked whole (one line naming the file,
the row and the cause) before anything is computed; a patient's vector is the case
transformer over its slides' stored vectors, written a row per patient; slide vectors
made with other weights are refused."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from tests.conftest import run_cli
from tilestore.embed.slides import (
    PatientTableError,
    SlideEncoderError,
    embed_patients,
    embed_slides,
    get_slide_encoder,
    load_slide_encoder,
    read_patient_table,
)
from tilestore.embed.slides.nets.moozy import Moozy
from tilestore.embed.slides.nets.titan import alibi_slopes
from tilestore.embeddings.slides import read_slide_vector
from tilestore.embeddings.write import write_features
from tilestore.errors import MixedResults, ModelError, OutputError
from tilestore.plan import PlanOptions, plan_over_tissue, save_plan
from tilestore.reading.opening import open_slide

MODEL = "lunit-vits8"


def test_moozy_is_registered_with_its_facts():
    spec = get_slide_encoder("moozy")
    assert (spec.tile_model, spec.mpp, spec.tile, spec.coords, spec.output_dim) == (
        MODEL,
        0.5,
        224,
        "grid",
        768,
    )
    assert (spec.repo, spec.weights_file, spec.gated, spec.precision) == (
        "AtlasAnalyticsLab/MOOZY",
        "moozy.pt",
        False,
        "fp32",
    )
    assert spec.licence == "CC-BY-NC-SA-4.0" and spec.patients
    assert not get_slide_encoder("titan").patients


def _dense_block(block, x, bias=None):
    """The authors' block (pre-norm, q/k/v projections, SDPA with an additive bias,
    LayerScale where present), on (n, dim) tokens in one piece."""
    n, dim = x.shape
    heads = block.heads
    y = block.norm1(x)
    q, k, v = (
        p(y).view(n, heads, -1).transpose(0, 1) for p in (block.q_proj, block.k_proj, block.v_proj)
    )
    scores = q @ k.transpose(-1, -2) / math.sqrt(dim // heads)
    if bias is not None:
        scores = scores + bias
    out = (torch.softmax(scores, -1) @ v).transpose(0, 1).reshape(n, dim)
    x = x + block.ls_attn(block.out_proj(out))
    return x + block.ls_mlp(block.fc2(F.gelu(block.fc1(block.norm2(x)))))


def _dense_moozy(module: Moozy, features, cells):
    """MOOZY's slide encoder as its authors compute it: class and register tokens at
    position 0 with their bias rows and columns zeroed, -slope x the Euclidean distance
    between level-0 positions divided by the tile's level-0 size."""
    enc = module.teacher_slide_encoder
    registers = enc.register_tokens.shape[1]
    x = torch.cat([enc.cls_token[0], enc.register_tokens[0], enc.input_proj(features)])
    step = 448.0  # level-0 px per tile: the authors divide it out again
    positions = torch.cat([torch.zeros(1 + registers, 2), cells.double() * step])
    distance = torch.cdist(positions, positions) / step
    slopes = -torch.tensor(alibi_slopes(len(enc.slopes)), dtype=torch.float64)
    bias = slopes.view(-1, 1, 1) * distance
    bias[:, : 1 + registers, :] = 0
    bias[:, :, : 1 + registers] = 0
    for block in enc.blocks:
        x = _dense_block(block, x, bias)
    return enc.norm(x)[0]


def test_moozy_equals_its_authors_arithmetic_and_chunks_change_nothing():
    torch.manual_seed(0)
    small = dict(
        in_dim=16,
        dim=24,
        depth=2,
        heads=6,
        hidden=32,
        registers=2,
        case_depth=2,
        case_heads=4,
        case_hidden=40,
    )
    whole = Moozy(**small).double().eval()
    for name, p in whole.named_parameters():
        with torch.no_grad():
            p.copy_(torch.randn_like(p) * 0.3 + (1 if name.endswith("gamma") else 0))
    chunked = Moozy(**small, budget=6 * 20 * 4 * 3).double().eval()
    chunked.load_state_dict(whole.state_dict())
    features = torch.randn(41, 16, dtype=torch.float64)
    cells = torch.stack([torch.arange(41) % 9, torch.arange(41) // 9 + 3], 1)
    with torch.no_grad():
        want = _dense_moozy(whole, features, cells)
        torch.testing.assert_close(whole(features, cells), want)
        torch.testing.assert_close(chunked(features, cells), want)
        slides = torch.randn(3, 24, dtype=torch.float64)
        case = whole.case_transformer
        x = torch.cat([case.case_token[0], slides])
        for block in case.blocks:
            x = _dense_block(block, x)
        torch.testing.assert_close(whole.patient(slides), case.norm(x)[0])
        torch.testing.assert_close(whole.patient(slides[[2, 0, 1]]), whole.patient(slides))


def test_moozys_checkpoint_of_two_modules_and_configs_loads_strictly(tmp_path):
    """moozy.pt as the authors save it: a torch file of the slide encoder's and the case
    transformer's state dicts (the ALiBi slopes under each block's name) and their configs."""
    reference = load_slide_encoder("random:moozy").module
    state = reference.state_dict()
    slopes = -torch.tensor(alibi_slopes(12)).unsqueeze(1)
    slide = {
        k.removeprefix("teacher_slide_encoder."): v
        for k, v in state.items()
        if k.startswith("teacher")
    }
    slide |= {"pos_bias.slopes": slopes} | {f"blocks.{i}.pos_bias.slopes": slopes for i in range(6)}
    case = {
        k.removeprefix("case_transformer."): v for k, v in state.items() if k.startswith("case")
    }
    payload = {
        "teacher_slide_encoder": slide,
        "slide_encoder_config": {"d_model": 768, "n_layers": 6, "qk_norm": False, "dropout": 0.1},
        "case_transformer": case,
        "case_transformer_config": {"num_layers": 3, "num_heads": 12, "layerscale_init": 1e-5},
    }
    path = tmp_path / "moozy.pt"
    torch.save(payload, path)
    loaded = load_slide_encoder("moozy", weights=path).module
    for key, value in loaded.state_dict().items():
        torch.testing.assert_close(value, state[key])
    payload["heads"] = [torch.zeros(2)]  # tensors that are not a state dict: refused
    torch.save(payload, path)
    with pytest.raises(ModelError, match=r"moozy.pt is not a plain state dict of tensors"):
        load_slide_encoder("moozy", weights=path)
    del payload["heads"]
    slide["blocks.3.pos_bias.slopes"] = slopes * 2  # learned slopes: not this architecture
    torch.save(payload, path)
    with pytest.raises(SlideEncoderError, match=r"blocks\.3\.pos_bias\.slopes holds ALiBi slopes"):
        load_slide_encoder("moozy", weights=path)


# -- patient tables and patient vectors -------------------------------------------------


@pytest.fixture
def cohort(store, tmp_path):
    """Three stores (slides a, b, c) with seeded 384-d lunit-vits8 features on a 0.5 um/px,
    224 px touching grid, and their random:moozy slide vectors."""
    paths = []
    for i, name in enumerate("abc"):
        path = store(into=tmp_path / "stores")
        path = path.rename(path.parent / f"{name}.ome.zarr")
        slide = open_slide(path)
        plan = plan_over_tissue(slide, PlanOptions(mpp=0.5, tile=224, min_tissue=0.0, name="p"))
        save_plan(slide, plan)
        rng = np.random.default_rng(i)
        write_features(
            path, {"name": MODEL}, rng.standard_normal((len(plan), 384), np.float32), plan="p"
        )
        paths.append(path)
    report = embed_slides(paths, "random:moozy", device="cpu")
    assert [r.status for r in report.rows] == ["done"] * 3
    return paths


def _table(tmp_path, text: str, name: str = "patients.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_patients_vector_is_the_case_transformer_over_its_slides_vectors(cohort, tmp_path):
    table = _table(tmp_path, "patient\tslide\nP2\tc\nP1\tb\nP1\ta\n", "patients.tsv")
    out = tmp_path / "patients.parquet"
    report = embed_patients(cohort, table, out, encoder="random:moozy", device="cpu")
    assert (report.patients, report.slides, report.precision) == (2, 3, "fp32")
    found = pd.read_parquet(out)
    assert list(found.patient) == ["P2", "P1"] and list(found.slides) == ["c", "b;a"]
    assert list(found.n_slides) == [1, 2]
    module = load_slide_encoder("random:moozy").module
    vectors = {p.name[0]: read_slide_vector(p, MODEL, "random:moozy")["vector"] for p in cohort}
    features = found[[f"f{i}" for i in range(768)]].to_numpy()
    for row, slides in enumerate(["c", "ba"]):
        with torch.no_grad():
            want = module.patient(torch.from_numpy(np.stack([vectors[s] for s in slides])))
        np.testing.assert_allclose(features[row], want.numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(OutputError, match="exists: pass overwrite=True"):
        embed_patients(cohort, table, out, encoder="random:moozy", device="cpu")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("slide,case\na,P1\n", r"patients.csv: no 'patient' column \(its header: slide, case\)"),
        ("slide,patient\na,P1\n,P2\n", r"patients.csv, row 3: no slide$"),
        (
            "slide,patient\na,P1\nb,P2\na,P2\n",
            r"row 4: slide 'a' is in patient 'P1' \(row 2\) and in patient 'P2' too",
        ),
        ("slide,patient\na,P1\na,P1\n", r"row 3: slide 'a' is in patient 'P1' \(row 2\) and again"),
        ("slide,patient\n", r"patients.csv: no rows under its header"),
    ],
)
def test_a_table_that_does_not_check_is_one_line_naming_the_file_and_row(tmp_path, text, why):
    with pytest.raises(PatientTableError, match=why) as found:
        read_patient_table(_table(tmp_path, text))
    assert "\n" not in str(found.value)


def test_slides_and_stores_must_match_the_table_before_the_model_loads(
    cohort, tmp_path, monkeypatch
):
    import tilestore.embed.slides.patients as patients

    monkeypatch.setattr(patients, "load_slide_encoder", lambda *a, **k: pytest.fail("loaded"))
    unknown = _table(tmp_path, "slide,patient\na,P1\nb,P1\nc,P2\nd,P2\n")
    with pytest.raises(PatientTableError, match=r"row 5: slide 'd' is not among the 3 store"):
        embed_patients(cohort, unknown, tmp_path / "o.csv", encoder="random:moozy")
    unlisted = _table(tmp_path, "slide,patient\na,P1\nb,P1\n")
    with pytest.raises(
        PatientTableError, match=r"no patient for slide 'c' \(.*c.ome.zarr\): add it"
    ):
        embed_patients(cohort, unlisted, tmp_path / "o.csv", encoder="random:moozy")
    with pytest.raises(PatientTableError, match=r"a patient table is a .csv or .tsv file"):
        embed_patients(cohort, tmp_path / "t.xlsx", tmp_path / "o.csv", encoder="random:moozy")
    with pytest.raises(
        SlideEncoderError, match="encoder='titan' makes no patient vectors; eagle, moozy do"
    ):
        embed_patients(cohort, unlisted, tmp_path / "o.csv", encoder="titan")
    assert not (tmp_path / "o.csv").exists()


def test_slide_vectors_made_with_other_weights_are_refused(cohort, tmp_path):
    """One store's vector remade with another checkpoint: the slides are not one recipe
    (`combine`); all of them remade so: not the weights the patient model loads."""
    import safetensors.torch

    module = load_slide_encoder("random:moozy", seed=5).module
    weights = tmp_path / "other.safetensors"
    safetensors.torch.save_file(
        {k: v.contiguous() for k, v in module.state_dict().items()}, weights
    )
    embed_slides(cohort[2:], "random:moozy", device="cpu", weights=weights, overwrite=True)
    table = _table(tmp_path, "slide,patient\na,P1\nb,P1\nc,P2\n")
    with pytest.raises(MixedResults, match="made with other settings"):
        embed_patients(cohort, table, tmp_path / "o.csv", encoder="random:moozy", device="cpu")
    embed_slides(cohort, "random:moozy", device="cpu", weights=weights, overwrite=True)
    with pytest.raises(SlideEncoderError, match="a patient's vector needs the weights its slides"):
        embed_patients(cohort, table, tmp_path / "o.csv", encoder="random:moozy", device="cpu")


def test_the_command_writes_the_table_and_refuses_a_bad_one_with_exit_2(cohort, tmp_path):
    table = _table(tmp_path, "slide,patient\na,P1\nb,P2\nc,P2\n")
    out = tmp_path / "patients.h5ad"
    stores = [str(p) for p in cohort]
    done = run_cli(
        "patients",
        *stores,
        "-t",
        str(table),
        "-o",
        str(out),
        "-s",
        "random:moozy",
        "--device",
        "cpu",
    )
    assert done.returncode == 0, done.stderr
    assert "2 patient(s) from 3 slide(s)" in done.stdout
    import anndata

    adata = anndata.read_h5ad(out)
    assert adata.shape == (2, 768) and list(adata.obs.index) == ["P1", "P2"]
    bad = _table(tmp_path, "slide,patient\na,P1\na,P2\n", "bad.csv")
    done = run_cli(
        "patients", *stores, "-t", str(bad), "-o", str(tmp_path / "x.csv"), "-s", "random:moozy"
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"tilestore: error: {bad}, row 3: slide 'a' is in patient 'P1' (row 2) and in patient "
        "'P2' too: a slide belongs to one patient, once"
    ]
