"""The GPU loop and the model's forward: the warm-up, compiling once, the model's stream,
and batches that are not finite as stored never written."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import zarr
from torch._dynamo.utils import counters

from tests.conftest import group_of
from tests.embed.conftest import settings
from tilestore.embed.engine import embed
from tilestore.embed.forward import Forward
from tilestore.embed.models import load_model
from tilestore.embed.report import Stats
from tilestore.embed.runner import Runner
from tilestore.embed.settings import Options
from tilestore.embeddings import NotEmbedded, open_embeddings
from tilestore.plan import PlanOptions, load_plan
from tilestore.reading.opening import open_slide

PLAN = PlanOptions(mpp=0.5, tile=224)


@pytest.fixture(scope="module")
def lite():
    return load_model("efficientnet-lite0")


def test_the_warm_up_batch_is_shaped_as_the_slides_tiles(store, lite, monkeypatch):
    """Compiled, the transform is in the graph: a warm-up at the model's input size, not the
    tiles' read size, would compile a graph no batch uses and leave the real one to the
    first batch."""
    warmed, computed = [], []
    original_warm_up, original_compute = Runner._warm_up, Forward.__call__

    def warm_up(self, stats, batch, read, say=None):
        warmed.append((batch, read))
        original_warm_up(self, stats, batch, read, say)

    def compute(self, tiles, count):
        computed.append(tuple(tiles.shape[1:]))
        return original_compute(self, tiles, count)

    monkeypatch.setattr(Runner, "_warm_up", warm_up)
    monkeypatch.setattr(Forward, "__call__", compute)
    options = Options(device="cpu", batch_size=4, precision="fp32", dtype="float32")
    path = store()
    embed([path], lite, plan=PlanOptions(mpp=0.75, tile=224), options=options)
    read = load_plan(open_slide(path))[0].spec.read
    assert read > 224  # 0.75 um/px read from the 0.5 um/px level, resized to 224
    assert warmed == [(4, read)]
    assert set(computed) == {(read, read, 3)}  # every batch is read x read, as the warm-up


def test_a_compiled_model_is_compiled_once_for_every_batch():
    """The transform's mean and std are made before the first compiled call: made inside
    it, the second call found them and was compiled again (in a run: the first batch after
    the warm-up)."""
    model = load_model("random:vit_tiny_patch16_224")
    compiled = Forward(model, torch.device("cpu"), "fp32", compile=True)
    tiles = torch.randint(0, 255, (2, 224, 224, 3), dtype=torch.uint8)
    before = counters["stats"]["unique_graphs"]
    for _ in range(3):
        compiled(tiles, 2)
    assert counters["stats"]["unique_graphs"] - before == 1


def test_on_a_gpu_the_warm_up_runs_the_model_on_that_shape(monkeypatch):
    shapes = []
    forward = lambda tiles, count: shapes.append(tiles.shape)  # noqa: E731
    # the branch a CUDA device takes, with its zeros made on the CPU
    gpu = Runner(forward, settings("cuda:0"), None, None)
    monkeypatch.setattr(torch, "zeros", lambda shape, **kw: torch.empty(shape, dtype=kw["dtype"]))
    stats = Stats()
    gpu._warm_up(stats, 8, 448)
    assert shapes == [(8, 448, 448, 3)] and gpu.warm and stats.get("warm_up") > 0


@pytest.mark.parametrize(("read", "compile_"), [(224, False), (448, False), (224, True)])
def test_on_a_gpu_the_warm_up_is_guessed_before_the_first_slide(monkeypatch, read, compile_):
    """Uncompiled, the model warms up on its own tile side before any slide is ready; the
    first slide's read warms it up again only where the guess was wrong. Compiled, nothing
    is guessed (a wrong guess would compile twice): the first slide's read is warmed up."""
    shapes = []
    forward = lambda tiles, count: shapes.append(tuple(tiles.shape))  # noqa: E731
    forward.loaded = SimpleNamespace(spec=SimpleNamespace(tile=224, name="m"))
    forward.loaded.describe = lambda: {"name": "m"}
    gpu = Runner(forward, settings("cuda:0", compile=compile_, compile_cache=None), None, None)
    monkeypatch.setattr(torch, "zeros", lambda shape, **kw: torch.empty(shape, dtype=kw["dtype"]))
    stats, n = Stats(), gpu.settings.batch_size
    gpu._guess_warm_up(stats, None)
    assert shapes == ([] if compile_ else [(n, 224, 224, 3)]) and not gpu.warm
    gpu._warm_for(stats, read, None)
    first = [] if compile_ else [(n, 224, 224, 3)]
    assert shapes == first + ([] if read == 224 and not compile_ else [(n, read, read, 3)])
    assert gpu.warm and gpu.warm_read == read
    gpu._guess_warm_up(stats, None)
    gpu._warm_for(stats, 448, None)  # warm: no other slide warms it up again
    assert len(shapes) == len(first) + (read != 224 or compile_)


@pytest.mark.parametrize("hit", [True, False])
def test_compile_workers_start_only_where_there_is_compiling_to_do(tmp_path, monkeypatch, hit):
    """A compile cache hit compiles in this process: Inductor's worker pool, started for
    nothing, made the process wait for it at exit (11 s on the H100)."""
    from torch._inductor import config

    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (b"graphs", {}))
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", lambda data: None)
    threads = []

    class Model:  # what the cache key and the warm-up's lines ask of a loaded model
        spec = SimpleNamespace(name="timm:vit_tiny")

        def describe(self):
            return {"name": "timm:vit_tiny", "weights": "w"}

    def forward(tiles, count):
        threads.append(config.compile_threads)

    forward.loaded = Model()
    run = settings("cpu", compile=True, compile_cache=str(tmp_path))
    with config.patch(compile_threads=8):  # a machine with cores to spare
        if hit:  # an earlier process saved this graph
            Runner(forward, run, None, None)._warm_up(Stats(), 4, 224)
            threads.clear()
        runner = Runner(forward, run, None, None)
        runner._warm_up(Stats(), 4, 224)
        assert threads == ([1] if hit else [8]) and config.compile_threads == 8
    assert any("no compile worker pool" in n for n in runner.notes) == hit


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_gpu_the_model_runs_on_a_stream_of_its_own(store, monkeypatch):
    """Not on the legacy default stream, which waits for every blocking stream (nvJPEG's)."""
    streams = set()
    original = Forward.__call__

    def compute(self, tiles, count):
        streams.add(torch.cuda.current_stream().cuda_stream)
        return original(self, tiles, count)

    monkeypatch.setattr(Forward, "__call__", compute)
    options = Options(batch_size=16, precision="fp32", dtype="float32")
    model = load_model("random:vit_tiny_patch16_224")
    report = embed([store()], model, plan=PlanOptions(mpp=0.5, tile=224), options=options)
    assert report.tiles > 16 and not report.failures
    assert len(streams) == 1 and torch.cuda.default_stream().cuda_stream not in streams


# -- features that are not finite as stored -----------------------------------------------


@contextlib.contextmanager
def poisoned(module: torch.nn.Module, batch: int, rows: list[int], change):
    """The model's output of its `batch`-th call (0: the first) with `rows` changed."""
    calls = []

    def hook(mod, args, out):
        calls.append(len(out))
        if len(calls) == batch + 1:
            out = out.clone()
            out[rows] = change(out[rows])
            return out
        return None

    handle = module.register_forward_hook(hook)
    try:
        yield calls
    finally:
        handle.remove()


def _group(path, model):
    return zarr.open_group(path / group_of(path, model), mode="r")


def _failed_alone(bad, good, model, batch, rows, report):
    """What a run that met a non-finite batch of `bad` (batch 1, `rows`) leaves: `bad` failed
    in one line naming the tiles and what is kept, its batch 0 done and kept, nothing after
    it written, `good` finished."""
    plan, _ = load_plan(open_slide(bad))
    assert [f["store"] for f in report.failures] == [str(bad)]
    error = report.failures[0]["error"]
    tiles = [batch + r for r in rows]
    named = ", ".join(f"{t} at ({plan.x[t]}, {plan.y[t]})" for t in tiles)
    assert f"{model} made NaN or infinite features for {len(rows)} tile(s) of batch 1" in error
    assert named in error and "\n" not in error
    blocks = -(-len(plan) // batch)
    assert error.endswith(
        f"(1 of {blocks} batches of {group_of(bad, model)} are written and kept: rerun the same "
        "command to resume)"
    )
    assert [s["store"] for s in report.slides if s.get("failed")] == [str(bad)]
    group = _group(bad, model)
    assert not group.attrs["tilestore"]["complete"]
    assert group["done"][:].tolist() == [1] + [0] * (blocks - 1)
    with pytest.raises(NotEmbedded, match="is unfinished"):
        open_embeddings(bad, model)
    assert _group(good, model).attrs["tilestore"]["complete"]
    assert np.isfinite(_group(good, model)["features"][:]).all()
    return plan


def test_a_batch_of_nan_features_fails_its_slide_and_the_run_goes_on(store, lite, tmp_path):
    """NaN in two tiles of the second batch: that batch is not written nor marked done, the
    slide's later batches are dropped, the next slide is embedded; rerun, only the batches
    not done are computed and the group is finished, finite."""
    bad, good = store(into=tmp_path / "bad"), store(into=tmp_path / "good")
    options = Options(batch_size=8, device="cpu", precision="fp32", dtype="float32")
    with poisoned(lite.module, 1, [3, 6], lambda x: x * np.nan) as calls:
        report = embed([bad, good], lite, plan=PLAN, options=options)
    plan = _failed_alone(bad, good, "efficientnet-lite0", 8, [3, 6], report)
    assert "dtype='float32'" not in report.failures[0]["error"]  # NaN: not float16's range
    # the slide's batches after the bad one are not computed, once the writer has seen it
    assert len(calls) < 2 * (-(-len(plan) // 8))
    again = embed([bad], lite, plan=PLAN, options=options)
    assert not again.failures and again.tiles == len(plan) - 8
    features = _group(bad, "efficientnet-lite0")["features"][:]
    assert np.isfinite(features).all() and _group(bad, "efficientnet-lite0")["done"][:].all()


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_features_are_judged_as_stored_float16_overflows(store, lite, tmp_path, dtype):
    """fp32 features past 65504 are finite as computed and infinite in float16: refused
    where float16 stores them (saying that dtype='float32' would keep them), stored in
    float32."""
    path = store()
    options = Options(batch_size=8, device="cpu", precision="fp32", dtype=dtype)
    with poisoned(lite.module, 0, [2], lambda x: x * 1e9 + 1e6):
        report = embed([path], lite, plan=PLAN, options=options)
    if dtype == "float32":
        assert not report.failures and _group(path, "efficientnet-lite0")["done"][:].all()
        assert np.isfinite(_group(path, "efficientnet-lite0")["features"][:]).all()
        return
    (failure,) = report.failures
    error, (plan, _) = failure["error"], load_plan(open_slide(path))
    assert f"batch 0 (plan tile, level-0 x, y: 2 at ({plan.x[2]}, {plan.y[2]}))" in error
    assert "infinities, no NaN: float16 stores so what passes its range (65504)" in error
    assert "dtype='float32' would keep them" in error
    assert error.endswith(
        f"(nothing was written: embeddings/efficientnet-lite0/{plan.name} removed, the store is "
        "as it was)"
    )
    assert not (path / "embeddings" / "efficientnet-lite0").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("decode", ["cpu", "gpu"])
def test_on_a_gpu_a_batch_not_finite_as_stored_fails_its_slide(
    store, tmp_path, decode, monkeypatch
):
    """The flag is reduced on the GPU and copied behind the features; bf16 values past
    float16's range count as the infinities float16 stores."""
    model = load_model("random:vit_tiny_patch16_224")
    bad, good = store(into=tmp_path / "bad"), store(into=tmp_path / "good")
    options = Options(batch_size=8, decode=decode, precision="bf16", dtype="float16")
    big = lambda x: x * 0 + 1e6  # noqa: E731 - finite in bf16, infinite in float16
    # on a GPU the model is replayed as a CUDA graph (a module's hook runs only as it is
    # captured): the rows are changed as the run's forward hands them on
    original, calls = Forward.__call__, []

    def forward(self, tiles, count):
        out = original(self, tiles, count)
        calls.append(count)
        if len(calls) == 3:  # call 0: the warm-up, 2: the 2nd batch
            out = out.clone()
            out[[0, 5]] = big(out[[0, 5]])
        return out

    monkeypatch.setattr(Forward, "__call__", forward)
    report = embed([bad, good], model, plan=PLAN, options=options)
    assert report.device.startswith("cuda")
    _failed_alone(bad, good, "random:vit_tiny_patch16_224", 8, [0, 5], report)
    assert "dtype='float32' would keep them" in report.failures[0]["error"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("plan", [PLAN, PlanOptions(mpp=0.75, tile=224)])
def test_on_a_gpu_a_run_warms_up_on_the_models_tile_before_its_first_slide(
    store, monkeypatch, plan
):
    """In a run, the guess comes before the first slide's start reaches the loop; the first
    slide warms the model up again only where its read is not the model's tile (0.75 um/px
    from the 0.5 um/px level: read larger, resized)."""
    warmed, started = [], []
    warm_up, warm_for = Runner._warm_up, Runner._warm_for

    def recorded_warm_up(self, stats, batch, read, say=None):
        warmed.append((read, bool(started)))
        warm_up(self, stats, batch, read, say)

    def recorded_warm_for(self, stats, read, say):
        started.append(read)
        warm_for(self, stats, read, say)

    monkeypatch.setattr(Runner, "_warm_up", recorded_warm_up)
    monkeypatch.setattr(Runner, "_warm_for", recorded_warm_for)
    path = store()
    embed([path], "random:vit_tiny_patch16_224", plan=plan, options=Options(batch_size=8))
    read = load_plan(open_slide(path))[0].spec.read
    assert warmed[0] == (224, False) and started == [read]
    assert warmed[1:] == ([] if read == 224 else [(read, True)])
    assert (read == 224) == (plan is PLAN)
