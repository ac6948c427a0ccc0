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
