"""The GPU loop and the model's forward: the warm-up, compiling once, the model's stream."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from tests.embed.conftest import settings
from tilestore.embed.engine import embed
from tilestore.embed.forward import Forward
from tilestore.embed.models import load_model
from tilestore.embed.report import Stats
from tilestore.embed.runner import Runner
from tilestore.embed.settings import Options
from tilestore.plan import PlanOptions, load_plan
from tilestore.reading.opening import open_slide


@pytest.fixture(scope="module")
def lite():
    return load_model("efficientnet-lite0")


def test_the_warm_up_batch_is_shaped_as_the_slides_tiles(store, lite, monkeypatch):
    """Compiled, the transform is in the graph: a warm-up at the model's input size, not the
    tiles' read size, would compile a graph no batch uses and leave the real one to the
    first batch."""
    warmed, computed = [], []
    original_warm_up, original_compute = Runner._warm_up, Forward.__call__

    def warm_up(self, stats, batch, read):
        warmed.append((batch, read))
        original_warm_up(self, stats, batch, read)

    def compute(self, tiles, count, eager=False):
        computed.append(tuple(tiles.shape[1:]))
        return original_compute(self, tiles, count, eager)

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
    model = load_model("timm:vit_tiny_patch16_224")
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


@pytest.mark.parametrize("hit", [True, False])
def test_compile_workers_start_only_where_there_is_compiling_to_do(tmp_path, monkeypatch, hit):
    """A compile cache hit compiles in this process: Inductor's worker pool, started for
    nothing, made the process wait for it at exit (11 s on the H100)."""
    from torch._inductor import config

    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (b"graphs", {}))
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", lambda data: None)
    threads = []

    class Model:  # what the cache key asks of a loaded model
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

    def compute(self, tiles, count, eager=False):
        streams.add(torch.cuda.current_stream().cuda_stream)
        return original(self, tiles, count, eager)

    monkeypatch.setattr(Forward, "__call__", compute)
    options = Options(batch_size=16, precision="fp32", dtype="float32")
    model = load_model("timm:vit_tiny_patch16_224")
    report = embed([store()], model, plan=PlanOptions(mpp=0.5, tile=224), options=options)
    assert report.tiles > 16 and not report.failures
    assert len(streams) == 1 and torch.cuda.default_stream().cuda_stream not in streams
