"""A compiled forward replayed as CUDA graphs: same results, one graph per shape, any thread."""

from __future__ import annotations

import threading

import pytest
import torch

from tilestore.embed.graphs import GraphedForward

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.GELU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten()
    ).cuda()


def test_each_replay_computes_on_the_new_input():
    model = _model()
    graphed = GraphedForward(torch.compile(model))
    with torch.inference_mode():
        for seed in range(4):
            x = torch.randn(
                4, 3, 32, 32, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)
            )
            torch.testing.assert_close(graphed(x).clone(), model(x), rtol=1e-4, atol=1e-5)
    assert len(graphed.graphs) == 1


def test_the_output_is_overwritten_by_the_next_call():
    """What the docstring warns of: a caller copies the output out before calling again."""
    graphed = GraphedForward(torch.compile(_model()))
    with torch.inference_mode():
        graphed(torch.zeros(2, 3, 16, 16, device="cuda"))  # captured
        first = graphed(torch.zeros(2, 3, 16, 16, device="cuda"))
        kept = first.clone()
        second = graphed(torch.ones(2, 3, 16, 16, device="cuda"))
    assert second.data_ptr() == first.data_ptr()
    assert not torch.equal(first, kept)


def test_a_new_shape_is_captured_apart_in_the_same_memory_pool():
    """Graphs of two shapes share one pool: replayed in turn, each output still right."""
    model = _model()
    graphed = GraphedForward(torch.compile(model))
    with torch.inference_mode():
        for n in (2, 4, 2, 4, 2):
            x = torch.randn(n, 3, 16, 16, device="cuda")
            torch.testing.assert_close(graphed(x).clone(), model(x), rtol=1e-4, atol=1e-5)
    assert sorted(shape[0] for shape, _ in graphed.graphs) == [2, 4]
    assert len({graph.pool() for graph, _, _ in graphed.graphs.values()}) == 1


def test_a_graph_captured_on_one_thread_replays_on_another():
    model = _model()
    graphed = GraphedForward(torch.compile(model))
    x = torch.randn(2, 3, 16, 16, device="cuda")
    with torch.inference_mode():
        graphed(x)  # captured here
    out = {}

    def replay() -> None:
        with torch.inference_mode():
            out["y"] = graphed(x + 1).clone()
            out["want"] = model(x + 1)

    thread = threading.Thread(target=replay)
    thread.start()
    thread.join()
    torch.testing.assert_close(out["y"], out["want"], rtol=1e-4, atol=1e-5)


def test_an_uncompiled_model_is_replayed_as_it_computes():
    """Issue 68: eager models are replayed too (one launch a batch, not one a op)."""
    model = _model()
    graphed = GraphedForward(model)
    with torch.inference_mode():
        for seed in range(3):
            x = torch.randn(
                4, 3, 32, 32, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)
            )
            assert torch.equal(graphed(x).clone(), model(x))  # the same kernels, replayed
    assert graphed.failed is None and len(graphed.graphs) == 1


class _Syncs(torch.nn.Module):
    """Asks the host for a value mid-forward: cannot be captured."""

    def forward(self, x):
        return x * float(x.abs().max().item() > 0)


class _Counts(torch.nn.Module):
    """A value of the capture baked into the graph: its replay is not what it computes."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x * self.calls


@pytest.mark.parametrize(
    ("model", "said"),
    [(_Syncs(), "not captured as a CUDA graph"), (_Counts(), "replay differs")],
)
def test_a_model_that_cannot_be_replayed_runs_as_it_is(model, said):
    graphed = GraphedForward(model)
    x = torch.randn(2, 3, 8, 8, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.inference_mode():
        first = graphed(x).clone()
        assert torch.cuda.current_stream() == stream  # not left on the capture's stream
        second = graphed(x + 1).clone()
    assert said in graphed.failed
    assert not graphed.graphs
    torch.randn(4, device="cuda")  # the device's random state is not left capturing
    if isinstance(model, _Syncs):  # the cause, not the capture's end's complaint about it
        assert "previous error during capture" not in graphed.failed
    if isinstance(model, _Syncs):
        assert torch.equal(first, x) and torch.equal(second, x + 1)
    else:  # every later call runs the model itself
        assert torch.equal(second, (x + 1) * model.calls)


def test_a_tiles_features_do_not_depend_on_the_tiles_beside_it():
    """On a GPU the whole batch buffer goes through, padded: a small slide's rows are the
    same bits alone or packed beside another slide's."""
    from tilestore.embed.forward import Forward
    from tilestore.embed.models import load_model

    loaded = load_model("random:vit_tiny_patch16_224")
    forward = Forward(loaded, torch.device("cuda"), "bf16", compile=False)
    loaded.module.cuda().eval()
    g = torch.Generator().manual_seed(0)
    tiles = torch.randint(0, 255, (8, 224, 224, 3), dtype=torch.uint8, generator=g).cuda()
    alone = forward(tiles.clone(), 3).clone()
    beside = tiles.clone()
    beside[3:] = torch.randint(0, 255, (5, 224, 224, 3), dtype=torch.uint8, generator=g).cuda()
    packed = forward(beside, 8).clone()
    assert forward.graph_note is None
    assert torch.equal(packed[:3], alone)
