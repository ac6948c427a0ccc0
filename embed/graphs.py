"""The forward replayed as a CUDA graph: one launch per batch instead of hundreds.

The GPU loop launches each batch from a thread that shares the GIL with the producer, the
writer and the decoders' dispatch threads; launched kernel by kernel, compiled ViT-S's
batches took 5% longer on an H100's GPU than alone (1.25 s of compute per slide vs 1.18 s
replayed as a graph, with tiles/s up 7%). torch.compile's own "reduce-overhead" mode
replays graphs too, but its graph trees keep per-thread state that older torch versions
set up on one thread only (pytorch#123177: an AssertionError where a Dask worker runs a
task on another thread) and reuse their outputs' memory in ways it polices at every call.
Captured here with torch.cuda.graph, a graph is a plain object any thread can replay.

Uncompiled models are replayed too (issue 68): every op an eager model launches releases the
GIL and takes it back, so a GPU loop launching ViT-S's ~200 ops a batch waited for the
GIL at each while the producer, the writer and the store lanes took their turns; with
small slides it spent 3.5 s of a 4.1 s run launching. A model that cannot be captured (a
host sync, a copy from pageable memory) or whose replay does not give what it computed
when captured runs as it is, and the run's report says why.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch


class GraphedForward:
    """Call `forward` (compiled or not) through one CUDA graph per input shape and dtype.

    The output is the graph's own tensor (after the first call of a shape): valid until the
    next call, which overwrites it in stream order, so a caller copies it out (or uses it)
    before calling again. Capture runs in thread-local mode: the producer and writer
    threads go on using CUDA meanwhile.
    """

    def __init__(self, forward: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.forward = forward
        # shape, dtype -> (graph, static input, static output)
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}
        # one memory pool for all of them (a cohort at two read sizes needs two graphs, not
        # twice the activations): safe as graphs replay one at a time, and each output is
        # used up before the next call, as the contract above already asks
        self.pool = None
        self.failed: str | None = None  # why `forward` runs as it is: not captured, or wrong

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.failed is not None:
            return self.forward(x)
        key = (tuple(x.shape), x.dtype)
        if key not in self.graphs:
            return self._capture(key, x)
        graph, static_in, static_out = self.graphs[key]
        static_in.copy_(x)
        graph.replay()
        return static_out

    def _capture(self, key: tuple, x: torch.Tensor) -> torch.Tensor:
        """Run `forward` on `x` on a side stream (compiling, autotuning and loading its
        kernels: nothing a graph may capture), then capture one call and check its replay
        on other input against the model run as it is; return the first run's output (the
        engine's warm-up runs the model once, not twice). Where the capture fails or the
        replay differs, `failed` says why and every call runs the model as it is."""
        static_in = x.clone()
        current = torch.cuda.current_stream(x.device)
        # torch.cuda.Stream() hands out one of a pool of 32 streams in turn, and another
        # thread's stream may be the one capturing (the producer's copies then failed:
        # "Cannot copy ... during CUDA graph capture"). Nothing else here, nor
        # torchvision's nvJPEG, asks for a high-priority stream: that pool is ours.
        side = torch.cuda.Stream(x.device, priority=-1)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            out = self.forward(static_in)
        current.wait_stream(side)
        out.record_stream(current)  # made on the side stream, used on this one
        graph = torch.cuda.CUDAGraph()
        pool = self.pool if self.pool is not None else torch.cuda.graph_pool_handle()
        # the capture registers the device's random state, and one that fails leaves it
        # capturing (every later random draw on the device then fails): it captures a copy
        generator = torch.cuda.default_generators[x.device.index]
        state = generator.graphsafe_get_state()
        generator.graphsafe_set_state(generator.clone_state())
        try:
            with torch.cuda.graph(graph, pool=pool, stream=side, capture_error_mode="thread_local"):
                static_out = self.forward(static_in)
        except RuntimeError as exc:  # the model syncs with the host, or copies from it
            # the capture's end failed before it put this thread's stream back and closed
            # the memory pool it captured into
            torch.cuda.set_stream(current)
            _close_pool(x.device, pool, release=self.pool is None)
            cause = exc.__context__ if exc.__context__ is not None else exc
            return self._give_up(f"not captured as a CUDA graph ({_first_line(cause)})", out)
        finally:
            generator.graphsafe_set_state(state)
        if not self._replays(graph, static_in, static_out, x):
            return self._give_up("its CUDA graph's replay differs from the model run as it is", out)
        self.pool = pool
        self.graphs[key] = (graph, static_in, static_out)
        return out

    def _replays(self, graph, static_in, static_out, x: torch.Tensor) -> bool:
        """Whether a replay on other input (random, of `x`'s kind) gives what the model
        computes on it run as it is: a value of the capture baked into the graph (a
        counter, a size read from the first input) gives another answer."""
        drawn = torch.Generator(x.device).manual_seed(0)  # the caller's random state kept
        if x.is_floating_point():
            probe = torch.randn(x.shape, generator=drawn, device=x.device, dtype=x.dtype)
        else:
            high = 256 if x.dtype == torch.uint8 else 128
            probe = torch.randint(0, high, x.shape, generator=drawn, device=x.device, dtype=x.dtype)
        static_in.copy_(probe)
        graph.replay()
        return _agree(static_out, self.forward(probe))

    def _give_up(self, why: str, out: torch.Tensor) -> torch.Tensor:
        """Run the model as it is from now on (its graphs of other shapes dropped too)."""
        self.failed = why
        self.graphs.clear()
        return out


def _close_pool(device: torch.device, pool, release: bool) -> None:
    """End the allocator's capture into `pool` where the failed capture left it going, and
    (a pool of this capture alone) release it: its blocks go back once freed."""
    # torch's private calls (as torch.cuda.graphs makes them): where one is not there, or
    # the pool was ended already by the capture's end, nothing more is done
    with contextlib.suppress(RuntimeError, TypeError, AttributeError):
        torch._C._cuda_endAllocateToPool(device.index, pool)
    if release:
        with contextlib.suppress(RuntimeError, TypeError, AttributeError):
            torch._C._cuda_releasePool(device.index, pool)


def _agree(replayed: torch.Tensor, computed: torch.Tensor) -> bool:
    """Whether a replay gives what the model computed on the same input (to rounding: a
    graph captured wrong, with a value of the capture baked in, is off by far more; a NaN
    in either is a disagreement)."""
    a, b = replayed.float(), computed.float()
    return a.shape == b.shape and bool(torch.allclose(a, b, rtol=1e-2, atol=1e-3))


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
