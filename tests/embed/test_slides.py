"""Slide encoders: each builds with its registered width; the authors' checkpoint layouts
load strictly into ours; the exact-but-chunked attentions equal the plain ones; tile
features an encoder was not made for are refused with one line; slide vectors are stored
beside the tile features they came from and refused once those are replaced."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import tilestore
from tests.conftest import group_of
from tilestore.embed.slides import (
    SlideEncoderError,
    build,
    embed_slides,
    get_slide_encoder,
    list_slide_encoders,
    load_slide_encoder,
)
from tilestore.embed.slides.load import CONVERT
from tilestore.embed.slides.nets.attention import attention_with_lse, chunked_attention
from tilestore.embed.slides.nets.longnet import LongNetSlide, segment_lengths, sincos
from tilestore.embed.slides.nets.mamba import ssd_scan
from tilestore.embed.slides.nets.titan import Titan, alibi_slopes
from tilestore.embeddings import NotEmbedded
from tilestore.embeddings.slides import (
    StaleSlideEmbedding,
    read_slide_vector,
    read_tile_features,
    slide_group_name,
)
from tilestore.embeddings.write import write_features
from tilestore.errors import StoreError
from tilestore.plan import PlanOptions, plan_over_tissue, save_plan
from tilestore.reading.opening import open_slide

SPECS = list_slide_encoders()
KEYS = json.loads((Path(__file__).parent / "slide_encoder_keys.json").read_text())


def test_the_peers_slide_encoders_are_registered_with_their_facts():
    names = {s.name for s in SPECS}
    names_wanted = {"titan", "prism", "gigapath", "chief", "madeleine", "feather", "moozy"}
    feathers = {"feather-uni", "feather-uni2"}  # FEATHER on its other tile models
    assert names_wanted | feathers | {"mean", "max"} <= names
    titan = get_slide_encoder("titan")
    assert (titan.tile_model, titan.mpp, titan.tile, titan.coords) == (
        "conch-v1.5",
        0.5,
        512,
        "grid",
    )
    assert get_slide_encoder("prism").tile_model == "virchow"  # its CLS + mean, 2560-d
    assert get_slide_encoder("chief").mpp == 1.0 and get_slide_encoder("madeleine").mpp == 1.0
    assert get_slide_encoder("moozy").tile_model == "lunit-vits8"  # its ViT-S/8, 384-d
    uni = get_slide_encoder("feather-uni")  # MIL-Lab: abmil.base.uni.pc108-24k
    assert (uni.tile_model, uni.mpp, uni.tile, uni.kwargs, uni.output_dim) == (
        "uni",
        0.5,
        256,
        {"in_dim": 1024},
        512,
    )
    for spec in SPECS:
        assert spec.licence and spec.reference, spec.name
    with pytest.raises(SlideEncoderError, match="unknown slide encoder 'nope'"):
        get_slide_encoder("nope")


def test_cobra_is_registered_with_its_facts():
    """COBRA II (KatherLab/COBRA get_cobraII): any of the four tile models it has a head
    for, its vector their weighted mean (their width); Virchow2 read as STAMP embeds it, its
    class token (the first 1280 of tilestore's 2560 features); no um/px or tile checked."""
    facts = {
        s.name: (s.tile_model, s.output_dim, s.kwargs.get("in_dim"), s.kwargs.get("width"))
        for s in SPECS
        if s.arch == "cobra"
    }
    assert facts == {
        "cobra": ("virchow2", 1280, 2560, 1280),
        "cobra-conch": ("conch-v1", 512, 512, None),
        "cobra-uni": ("uni", 1024, 1024, None),
        "cobra-h-optimus-0": ("h-optimus-0", 1536, 1536, None),
    }
    cobra = get_slide_encoder("cobra")
    assert (cobra.mpp, cobra.tile, cobra.coords, cobra.precision) == (None, None, "none", "fp32")
    assert (cobra.repo, cobra.weights_file, cobra.gated) == (
        "KatherLab/COBRA",
        "cobraII.pth.tar",
        True,
    )


def _sequential_scan(x, dt, a, b, c):
    """The SSM's recurrence one tile at a time: h = exp(dt a) h + dt x b^T, y = h c."""
    heads = x.shape[1]
    b, c = (t.repeat_interleave(heads // t.shape[1], dim=1) for t in (b, c))
    state = torch.zeros(heads, x.shape[2], b.shape[2], dtype=x.dtype)
    out = []
    for t in range(len(x)):
        decay = torch.exp(dt[t] * a)[:, None, None]
        state = state * decay + (dt[t, :, None] * x[t])[:, :, None] * b[t][:, None, :]
        out.append((state * c[t][:, None, :]).sum(-1))
    return torch.stack(out)


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 70),
    groups=st.sampled_from([1, 2]),
    chunk=st.sampled_from([1, 7, 16, 128]),
)
def test_the_chunked_ssd_scan_equals_the_recurrence_one_tile_at_a_time(n, groups, chunk):
    g = torch.Generator().manual_seed(n * 31 + chunk)
    x = torch.randn(n, 4, 3, generator=g, dtype=torch.float64)
    dt = torch.rand(n, 4, generator=g, dtype=torch.float64)
    a = -2 * torch.rand(4, generator=g, dtype=torch.float64)
    b, c = (torch.randn(n, groups, 5, generator=g, dtype=torch.float64) for _ in range(2))
    torch.testing.assert_close(ssd_scan(x, dt, a, b, c, chunk), _sequential_scan(x, dt, a, b, c))


def test_cobra_loads_a_bare_model_checkpoint_and_refuses_other_features(tmp_path):
    """A state dict of the model alone (no training wrapper, as get_cobraII also accepts)
    loads strictly; a width COBRA has no head for is refused when built."""
    import safetensors.torch

    layout = {k.removeprefix("module.momentum_enc."): s for k, s in KEYS["cobra"].items()}
    state = {
        k: torch.full(shape, 0.25)
        for k, shape in layout.items()
        if "base_enc" not in k and "predictor" not in k
    }
    path = tmp_path / "w.safetensors"
    safetensors.torch.save_file(state, path)
    module = load_slide_encoder("cobra-uni", weights=path).module
    assert all(bool((v == 0.25).all()) for v in module.state_dict().values())
    with pytest.raises(ValueError, match="COBRA has no head for 768-d features"):
        build(replace(get_slide_encoder("cobra"), kwargs={"in_dim": 768}))


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_builds_on_the_meta_device_with_its_registered_dim(spec):
    with torch.device("meta"):
        module = build(spec, in_dim=384)
        width = module.in_dim
        guide = {"guide": torch.zeros(9, spec.kwargs["guide_dim"])} if spec.guide else {}
        out = module(torch.zeros(9, width), torch.zeros(9, 2, dtype=torch.long), **guide)
    assert tuple(out.shape) == (spec.output_dim or 384,)
    assert width == spec.kwargs.get("in_dim", 384)


@pytest.mark.parametrize("name", sorted(KEYS), ids=str)
def test_the_authors_checkpoint_layout_loads_strictly_into_ours(name, tmp_path):
    """The tensors the authors' modules save (names and shapes recorded from their code by
    bench/slide_encoders.py, where the values matched), converted and loaded strictly: a
    renamed or reshaped tensor on either side fails here."""
    import safetensors.torch

    spec = get_slide_encoder(name)
    state = {k: torch.full(shape, 0.5) for k, shape in KEYS[name].items()}
    for key in [k for k in state if k.endswith("pos_bias.slopes")]:  # MOOZY's saved buffers
        state[key] = -torch.tensor(alibi_slopes(state[key].numel())).view(state[key].shape)
    path = tmp_path / "weights.safetensors"
    safetensors.torch.save_file(state, path)
    loaded = load_slide_encoder(spec, weights=path)
    mine = loaded.module.state_dict()
    assert mine and all(bool((v == 0.5).all()) for v in mine.values())
    assert len(CONVERT[spec.arch](state)) == len(mine)


def test_a_checkpoint_missing_a_tensor_is_refused_with_one_line(tmp_path):
    import safetensors.torch

    state = {k: torch.zeros(s) for k, s in KEYS["feather"].items()}
    state.pop(next(k for k in state if "attention_c" in k))
    path = tmp_path / "w.safetensors"
    safetensors.torch.save_file(state, path)
    with pytest.raises(SlideEncoderError, match=r"feather: weights do not fit.*missing"):
        load_slide_encoder("feather", weights=path)


def test_encoders_without_hub_weights_say_where_they_come_from():
    with pytest.raises(SlideEncoderError, match="chief: its weights are not on the Hugging Face"):
        load_slide_encoder("chief")


def test_prism_loads_its_shared_layers_from_whichever_name_they_were_saved_under(tmp_path):
    """Its layers 2-7 reuse layer 1's cross-attention and every layer layer 0's blocks: a
    checkpoint may hold them once, under any of those names."""
    import safetensors.torch

    keys = KEYS["prism"]
    state = {}
    for k, shape in keys.items():
        moved = k.replace("layers.1.xattn", "layers.5.xattn").replace("layers.0.tf", "layers.3.tf")
        state[moved] = torch.full(shape, 0.25)
    path = tmp_path / "w.safetensors"
    safetensors.torch.save_file(state, path)
    module = load_slide_encoder("prism", weights=path).module
    assert all(bool((v == 0.25).all()) for v in module.state_dict().values())


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 40), heads=st.sampled_from([1, 3, 4]), budget=st.integers(64, 4096))
def test_chunked_attention_with_a_bias_equals_one_softmax(n, heads, budget):
    g = torch.Generator().manual_seed(n * 7 + heads)
    q, k, v = (torch.randn(heads, n, 8, generator=g, dtype=torch.float64) for _ in range(3))
    bias = torch.randn(heads, n, n, generator=g, dtype=torch.float64)
    whole = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    parts = chunked_attention(q, k, v, lambda a, b: bias[:, a:b], budget=budget)
    torch.testing.assert_close(parts, whole)
    out, lse = attention_with_lse(q, k, v, budget=budget)  # its softmax in float32
    plain = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, plain, rtol=1e-6, atol=1e-6)
    scores = q @ k.transpose(-1, -2) / math.sqrt(8)
    torch.testing.assert_close(lse, scores.logsumexp(-1).float())


def test_titan_attention_in_small_chunks_equals_one_chunk():
    """The ALiBi bias made row chunk by row chunk (100,000 tiles in memory n, not n^2)."""
    torch.manual_seed(0)
    whole = Titan(in_dim=16, dim=24, depth=2, heads=3, pool_heads=3)
    chunked = Titan(in_dim=16, dim=24, depth=2, heads=3, pool_heads=3, budget=3 * 40 * 4 * 5)
    chunked.load_state_dict(whole.state_dict())
    features = torch.randn(37, 16)
    cells = torch.stack([torch.arange(37) % 7, torch.arange(37) // 7], 1)
    torch.testing.assert_close(chunked.eval()(features, cells), whole.eval()(features, cells))


def test_alibi_slopes_are_the_geometric_ones():
    assert alibi_slopes(8) == [2 ** -(i + 1) for i in range(8)]
    twelve = alibi_slopes(12)
    assert twelve[:8] == alibi_slopes(8) and twelve[8:] == alibi_slopes(16)[0::2][:4]


def test_longnet_segments_and_positions_are_the_authors():
    assert segment_lengths() == [1024, 5792, 32768, 185363, 1048576]
    emb = sincos(torch.tensor([0, 3]), 8)
    assert emb.shape == (2, 8) and emb[0, :4].abs().sum() == 0 and (emb[0, 4:] == 1).all()
    module = LongNetSlide(in_dim=8, dim=16, depth=1, heads=16, layer=1, grid_size=10)
    with pytest.raises(ValueError, match="outside the encoder's 10 x 10 grid"):
        module.positions(torch.tensor([[10, 0]]))


def _dense_dilated(q, k, v, segments, ratios):
    """LongNet's dilated attention written out plainly: per branch, per head group r,
    attention among positions r, r + ratio... of each (zero-padded) segment; branches
    merged by their log-sum-exps."""
    n, heads, d = q.shape
    outs, lses = [], []
    for size, ratio in zip(segments, ratios, strict=True):
        size = min(size, n)
        count = -(-n // size)
        padded = -(-size // ratio) * ratio
        out = torch.zeros(count * padded, heads, d, dtype=q.dtype)
        lse = torch.full((count * padded, heads), -1e8, dtype=torch.float32)
        for seg in range(count):
            for h in range(heads):
                r = h // (heads // ratio)
                src = [seg * size + p for p in range(r, padded, ratio)]
                dst = [seg * padded + p for p in range(r, padded, ratio)]

                end = min(n, (seg + 1) * size)  # past it: zero padding

                def pick(t, src=src, h=h, end=end):
                    zero = torch.zeros(d, dtype=t.dtype)
                    return torch.stack([t[i, h] if i < end else zero for i in src])

                scores = pick(q) @ pick(k).T / math.sqrt(d)
                out[dst, h] = torch.softmax(scores, -1) @ pick(v)
                lse[dst, h] = scores.logsumexp(-1).float()
        outs.append(out[:n])
        lses.append(lse[:n])
    weights = torch.softmax(torch.stack(lses), 0).unsqueeze(-1)
    return (torch.stack(outs) * weights.to(q.dtype)).sum(0)


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 30))
def test_dilated_attention_equals_the_plain_sums(n):
    from tilestore.embed.slides.nets.longnet import _DilatedAttention

    torch.manual_seed(n)
    attn = _DilatedAttention(8, 4, segments=[4, 7, 64], ratios=[1, 2, 4]).double()
    q, k, v = (torch.randn(n, 4, 2, dtype=torch.float64) for _ in range(3))
    outs = [attn._branch(q, k, v, s, r) for s, r in zip([4, 7, 64], [1, 2, 4], strict=True)]
    weights = torch.softmax(torch.stack([o[1] for o in outs]), 0).unsqueeze(-1)
    merged = (torch.stack([o[0] for o in outs]) * weights).sum(0)
    assert merged.shape == (n, 4, 2)
    plain = _dense_dilated(q, k, v, [4, 7, 64], [1, 2, 4])
    torch.testing.assert_close(merged, plain, rtol=1e-6, atol=1e-6)  # softmax in float32


# -- stores ----------------------------------------------------------------------------


@pytest.fixture
def featured(store):
    """CMU-1-Small-Region with seeded 768-d 'conch-v1.5' features on a 0.5 um/px, 512 px
    plan (what TITAN and FEATHER read), written through the embeddings writer."""
    path = store()
    slide = open_slide(path)
    plan = plan_over_tissue(slide, PlanOptions(mpp=0.5, tile=512, min_tissue=0.0, name="p512"))
    save_plan(slide, plan)
    rng = np.random.default_rng(1)
    features = rng.standard_normal((len(plan), 768)).astype(np.float32)
    write_features(path, {"name": "conch-v1.5"}, features, plan="p512")
    return path, features


def test_mean_and_max_are_the_stored_features_mean_and_max(featured):
    path, features = featured
    for name, expected in (("mean", features.mean(0)), ("max", features.max(0))):
        report = embed_slides([path], name, model="conch-v1.5", device="cpu")
        assert [r.status for r in report.rows] == ["done"]
        vector = read_slide_vector(path, "conch-v1.5", name)["vector"]
        np.testing.assert_allclose(vector, expected, rtol=1e-6, atol=1e-6)


def test_a_slide_vector_is_stored_beside_its_tiles_and_opened_per_slide(featured, store):
    path, features = featured
    report = embed_slides([path], "random:titan", device="cpu")
    assert report.rows[0].status == "done" and report.rows[0].tiles == len(features)
    group = Path(path) / slide_group_name(group_of(path, "conch-v1.5"), "random:titan")
    assert (group / "zarr.json").is_file() and not list(group.parent.glob(".*"))
    ds = tilestore.open_embeddings([path], "conch-v1.5", slide_encoder="random:titan")
    assert ds.features.shape == (1, 768) and ds["n_tiles"].item() == report.rows[0].tiles
    assert ds.attrs["encoder_info"]["weights"].startswith("random")
    again = embed_slides([path], "random:titan", device="cpu")
    assert again.rows[0].status == "skipped"  # done already: not computed again
    # the tile embeddings still open as before, the slides subgroup beside them
    assert tilestore.open_embeddings([path], "conch-v1.5").sizes["tile"] == report.rows[0].tiles


def test_a_slide_vector_of_replaced_tile_features_is_refused(featured):
    path, features = featured
    embed_slides([path], "mean", model="conch-v1.5", device="cpu")
    write_features(path, {"name": "conch-v1.5"}, features * 2, plan="p512", overwrite=True)
    with pytest.raises((StaleSlideEmbedding, NotEmbedded)):
        read_slide_vector(path, "conch-v1.5", "mean")
    report = embed_slides([path], "mean", model="conch-v1.5", device="cpu")
    assert report.rows[0].status == "done"
    vector = read_slide_vector(path, "conch-v1.5", "mean")["vector"]
    np.testing.assert_allclose(vector, features.mean(0) * 2, rtol=1e-5, atol=1e-6)


def test_a_stale_vector_left_by_an_old_tile_group_is_refused(featured):
    """The tile group replaced in place (its slides subgroup kept): the vector records the
    group it read, and that group is gone."""
    import zarr

    path, _ = featured
    embed_slides([path], "max", model="conch-v1.5", device="cpu")
    group = zarr.open_group(path, path=group_of(path, "conch-v1.5"), mode="r+")
    attrs = dict(group.attrs["tilestore"])
    group.attrs["tilestore"] = {**attrs, "finished": "2031-01-01T00:00:00+00:00"}
    with pytest.raises(StaleSlideEmbedding, match="replaced since"):
        read_slide_vector(path, "conch-v1.5", "max")


def test_what_a_killed_write_left_is_cleared_and_the_old_vector_kept(featured):
    """A write killed between its renames leaves the old vector aside and a partial group:
    the next write puts the old one back first (nothing lost), removes the partial of a
    process that is gone, and ends with one vector in place and nothing hidden."""
    import shutil
    import socket

    path, features = featured
    embed_slides([path], "mean", model="conch-v1.5", device="cpu")
    target = Path(path) / slide_group_name(group_of(path, "conch-v1.5"), "mean")
    host = "".join(c if c.isalnum() or c in "_-" else "_" for c in socket.gethostname())
    dead = target.parent / f".{target.name}.partial.{host}.{2**22 + 7}.0badc0de"
    shutil.copytree(target, dead)
    target.rename(target.parent / f".{target.name}.replaced.0badc0de")
    with pytest.raises(NotEmbedded):
        read_slide_vector(path, "conch-v1.5", "mean")
    report = embed_slides([path], "mean", model="conch-v1.5", device="cpu")
    assert report.rows[0].status == "done"
    assert not list(target.parent.glob(".*")), "leftovers of the killed write remain"
    vector = read_slide_vector(path, "conch-v1.5", "mean")["vector"]
    np.testing.assert_allclose(vector, features.mean(0), rtol=1e-5, atol=1e-6)


def test_a_damaged_slide_vector_is_one_store_error_and_verify_finds_it(featured):
    from tilestore.reading import verify_store

    path, _ = featured
    embed_slides([path], "mean", model="conch-v1.5", device="cpu")
    chunk = next(
        (Path(path) / slide_group_name(group_of(path, "conch-v1.5"), "mean") / "embedding").rglob(
            "0"
        )
    )
    data = bytearray(chunk.read_bytes())
    data[3] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with pytest.raises(StoreError, match=r"slides/mean is damaged .*--overwrite\)$"):
        read_slide_vector(path, "conch-v1.5", "mean")
    assert not verify_store(path).ok


def test_a_slide_vector_that_is_not_finite_is_never_written(featured, monkeypatch):
    """Whatever an encoder makes of finite tile features, a vector with an infinity is
    refused before anything is written, naming the store; one damaged after it was written
    is refused when read, and computed again."""
    import zarr

    from tilestore.embed.slides.load import LoadedSlideEncoder
    from tilestore.errors import DamagedEmbeddings

    path, features = featured
    encode = LoadedSlideEncoder.encode

    def overflowing(self, tiles, device, precision, guide=None):
        vector = encode(self, tiles, device, precision, guide)
        vector[7] = np.inf
        return vector

    with monkeypatch.context() as patch:
        patch.setattr(LoadedSlideEncoder, "encode", overflowing)
        (row,) = embed_slides([path], "mean", model="conch-v1.5", device="cpu").rows
    assert row.status == "failed" and row.why == (
        f"{path}: mean made a slide embedding with NaN or infinite values from "
        f"{len(features)} finite tile features of conch-v1.5; "
        f"{group_of(path, 'conch-v1.5')}/slides/mean is not written"
    )
    target = Path(path) / slide_group_name(group_of(path, "conch-v1.5"), "mean")
    assert not target.exists() and not list(target.parent.glob(".*"))
    assert embed_slides([path], "mean", model="conch-v1.5", device="cpu").rows[0].status == "done"
    zarr.open_array(target / "embedding", mode="r+")[[3, 9]] = np.nan
    damaged = r"mean/embedding holds NaN or infinite values in 2 value\(s\) \(3, 9\), which no "
    with pytest.raises(DamagedEmbeddings, match=damaged + r"run writes: it is damaged; compute it"):
        read_slide_vector(path, "conch-v1.5", "mean")
    assert embed_slides([path], "mean", model="conch-v1.5", device="cpu").rows[0].status == "done"
    vector = read_slide_vector(path, "conch-v1.5", "mean")["vector"]
    np.testing.assert_allclose(vector, features.mean(0), rtol=1e-5, atol=1e-6)


def test_tile_features_that_are_not_finite_are_not_stored(store):
    """Features made elsewhere are stored only finite: readers take a NaN for damage."""
    from tilestore.embeddings import EmbeddingError

    path = store()
    slide = open_slide(path)
    plan = plan_over_tissue(slide, PlanOptions(mpp=0.5, tile=512, min_tissue=0.0, name="p512"))
    save_plan(slide, plan)
    features = np.ones((len(plan), 8), np.float32)
    features[[1, 4], 2] = [np.nan, -np.inf]
    with pytest.raises(EmbeddingError, match=r"NaN or infinite values in 2 row\(s\) \(1, 4\)"):
        write_features(path, {"name": "conch-v1.5"}, features, plan="p512")
    assert not (Path(path) / "embeddings" / "conch-v1.5").exists()


@pytest.mark.parametrize(
    ("encoder", "plan", "why"),
    [
        ("random:titan", PlanOptions(mpp=1.0, tile=512), "reads tiles at 0.5 um/px, these are at"),
        ("random:titan", PlanOptions(mpp=0.5, tile=224), "reads 512 px tiles, these are 224 px"),
        (
            "random:titan",
            PlanOptions(mpp=0.5, tile=512, stride=256),
            "grid of touching tiles; this plan's tiles step",
        ),
        ("random:feather-uni2", PlanOptions(mpp=0.5, tile=256), "reads uni2-h tile features"),
        ("random:feather-uni", PlanOptions(mpp=0.5, tile=256), "reads uni tile features"),
    ],
)
def test_tile_features_an_encoder_was_not_made_for_are_refused_with_one_line(
    store, encoder, plan, why
):
    path = store()
    slide = open_slide(path)
    made = plan_over_tissue(slide, replace(plan, min_tissue=0.0, name="p"))
    save_plan(slide, made)
    rng = np.random.default_rng(0)
    features = rng.standard_normal((len(made), 768)).astype(np.float32)
    write_features(path, {"name": "conch-v1.5"}, features, plan="p")
    model = None if "uni" not in encoder else "conch-v1.5"
    if model:
        with pytest.raises(SlideEncoderError, match=why):
            embed_slides([path], encoder, model=model, device="cpu")
        return
    report = embed_slides([path], encoder, device="cpu")
    (row,) = report.rows
    assert row.status == "failed" and why in row.why and "\n" not in row.why
    assert not (Path(path) / "embeddings/conch-v1.5/slides").exists()  # nothing written


def test_tile_features_of_another_width_are_refused(featured, store):
    path, features = featured
    narrow = np.zeros((len(features), 512), np.float32)
    write_features(path, {"name": "conch-v1.5"}, narrow, plan="p512", overwrite=True)
    (row,) = embed_slides([path], "random:feather", device="cpu").rows
    assert row.status == "failed" and "reads 768-d tile features, these are 512-d" in row.why


def test_a_store_without_the_tile_features_is_refused_and_the_others_go_on(featured, store):
    path, _ = featured
    bare = store(into=Path(path).parent / "other")
    report = embed_slides([bare, path], "mean", model="conch-v1.5", device="cpu")
    assert [r.status for r in report.rows] == ["failed", "done"]
    assert "no embeddings/conch-v1.5" in report.rows[0].why


def test_a_cohort_of_slide_vectors_opens_as_slide_by_feature(featured, store, tmp_path):
    path, _ = featured
    other = store(into=tmp_path / "b")
    slide = open_slide(other)
    save_plan(
        slide, plan_over_tissue(slide, PlanOptions(mpp=0.5, tile=512, min_tissue=0.0, name="p"))
    )
    count = len(read_tile_features(path, "conch-v1.5").features)
    write_features(other, {"name": "conch-v1.5"}, np.ones((count, 768), np.float32), plan="p")
    embed_slides([path, other], "mean", model="conch-v1.5", device="cpu")
    with pytest.raises(StoreError, match="two stores share the slide name"):
        tilestore.open_embeddings([path, other], "conch-v1.5", slide_encoder="mean")
    renamed = other.parent / "renamed.ome.zarr"
    other.rename(renamed)
    ds = tilestore.open_embeddings([path, renamed], "conch-v1.5", slide_encoder="mean")
    assert ds.features.dims == ("slide", "feature") and ds.sizes == {"slide": 2, "feature": 768}
    np.testing.assert_allclose(ds.features.values[1], 1.0)
    with pytest.raises(NotEmbedded):
        tilestore.open_embeddings([path], "conch-v1.5", slide_encoder="max")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("spec", [s for s in SPECS if s.source != "none"], ids=lambda s: s.name)
def test_on_the_gpu_in_the_authors_precision_it_agrees_with_fp32_on_the_cpu(spec):
    """Random weights, 3,000 tiles on a grid: the CUDA run under autocast in the authors'
    precision (fp16, bf16) against fp32 on the CPU."""
    from tilestore.embed.slides.load import AUTOCAST

    cpu = load_slide_encoder(f"random:{spec.name}", in_dim=384)
    gpu = load_slide_encoder(f"random:{spec.name}", in_dim=384, device="cuda")
    width = cpu.in_dim
    g = torch.Generator().manual_seed(3)
    features = torch.randn(3000, width, generator=g)
    cells = torch.stack([torch.arange(3000) % 60, torch.arange(3000) // 60], 1)
    guide = torch.randn(3000, spec.kwargs.get("guide_dim", 1), generator=g)
    given = (lambda device: {"guide": guide.to(device)}) if spec.guide else (lambda device: {})
    with torch.inference_mode():
        want = cpu.module(features, cells, **given("cpu"))
        dtype = AUTOCAST.get(spec.precision)
        with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
            got = gpu.module(features.cuda(), cells.cuda(), **given("cuda")).float().cpu()
    cosine = F.cosine_similarity(got, want, dim=0).item()
    assert cosine > 0.999, f"{spec.name} on CUDA in {spec.precision}: cosine {cosine}"
