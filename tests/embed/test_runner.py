"""The GPU loop: --decode as it resolves before any slide is read, and the warm-up."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch._dynamo.utils import counters

from embed import runner
from embed.engine import Options, embed
from embed.models import load_model
from embed.runner import Runner, decode_mode
from tilestore.errors import TilestoreError
from tilestore.plans import load_plan
from tilestore.slide import open_slide


@pytest.fixture(scope="module")
def lite():
    return load_model("efficientnet-lite0")


@pytest.mark.parametrize(
    ("option", "cuda", "nvjpeg", "cpus", "want"),
    [
        ("auto", False, True, 16, "cpu"),  # no GPU: nothing else can decode
        ("auto", False, True, 2, "cpu"),
        ("auto", True, True, 16, "cpu"),  # 14 decoder processes keep a GPU fed
        ("auto", True, True, 8, "cpu"),
        ("auto", True, True, 7, "gpu"),  # too few CPUs to keep a GPU fed
        ("auto", True, True, 3, "gpu"),
        ("auto", True, False, 3, "cpu"),  # torchvision cannot decode on this GPU (ROCm)
        ("auto", True, False, 16, "cpu"),
        ("cpu", True, True, 3, "cpu"),  # as asked
        ("gpu", True, True, 16, "gpu"),
    ],
)
def test_decode_mode(monkeypatch, option, cuda, nvjpeg, cpus, want):
    monkeypatch.setattr(runner, "usable_cpus", lambda: cpus)
    assert decode_mode(option, cuda, nvjpeg) == want


def test_bad_decode_options_are_one_line_errors():
    with pytest.raises(TilestoreError, match=r"^--decode nvdec: choose auto, cpu or gpu$"):
        decode_mode("nvdec", True)
    with pytest.raises(TilestoreError, match=r"^--decode gpu needs a CUDA device$"):
        decode_mode("gpu", False)


def test_the_warm_up_batch_is_shaped_as_the_slides_tiles(store, lite, monkeypatch):
    """Compiled, the transform is in the graph: a warm-up at the model's input size, not the
    tiles' read size, would compile a graph no batch uses and leave the real one to the
    first batch."""
    warmed, computed = [], []
    original_warm_up, original_compute = Runner._warm_up, Runner.compute

    def warm_up(self, batch, read):
        warmed.append((batch, read))
        original_warm_up(self, batch, read)

    def compute(self, tiles, count, eager=False):
        computed.append(tuple(tiles.shape[1:]))
        return original_compute(self, tiles, count, eager)

    monkeypatch.setattr(Runner, "_warm_up", warm_up)
    monkeypatch.setattr(Runner, "compute", compute)
    options = Options(device="cpu", batch_size=4, precision="fp32", dtype="float32")
    path = store()
    embed([path], lite, plan_options={"mpp": 0.75, "tile": 224}, options=options)
    read = load_plan(open_slide(path))[0].spec.read
    assert read > 224  # 0.75 um/px read from the 0.5 um/px level, resized to 224
    assert warmed == [(4, read)]
    assert set(computed) == {(read, read, 3)}  # every batch is read x read, as the warm-up


def test_a_compiled_model_is_compiled_once_for_every_batch():
    """The transform's mean and std are made before the first compiled call: made inside
    it, the second call found them and was compiled again (in a run: the first batch after
    the warm-up)."""
    model = load_model("timm:vit_tiny_patch16_224")
    compiled = Runner(model, torch.device("cpu"), "fp32", Options(device="cpu", compile=True))
    tiles = torch.randint(0, 255, (2, 224, 224, 3), dtype=torch.uint8)
    before = counters["stats"]["unique_graphs"]
    for _ in range(3):
        compiled.compute(tiles, 2)
    assert counters["stats"]["unique_graphs"] - before == 1


def test_on_a_gpu_the_warm_up_runs_the_model_on_that_shape(monkeypatch):
    shapes = []
    gpu = Runner(SimpleNamespace(), torch.device("cpu"), "fp32", Options())
    gpu.cuda = True  # the branch a CUDA device takes, run on the CPU
    monkeypatch.setattr(gpu, "compute", lambda tiles, count: shapes.append(tiles.shape))
    gpu._warm_up(8, 448)
    assert shapes == [(8, 448, 448, 3)] and gpu.warm


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_gpu_the_model_runs_on_a_stream_of_its_own(store, monkeypatch):
    """Not on the legacy default stream, which waits for every blocking stream (nvJPEG's)."""
    streams = set()
    original = Runner.compute

    def compute(self, tiles, count, eager=False):
        streams.add(torch.cuda.current_stream().cuda_stream)
        return original(self, tiles, count, eager)

    monkeypatch.setattr(Runner, "compute", compute)
    options = Options(batch_size=16, precision="fp32", dtype="float32")
    model = load_model("timm:vit_tiny_patch16_224")
    report = embed([store()], model, plan_options={"mpp": 0.5, "tile": 224}, options=options)
    assert report.tiles > 16 and not report.failures
    assert len(streams) == 1 and torch.cuda.default_stream().cuda_stream not in streams
