"""The GPU made ready while the run imports the rest: CUDA's context, cuBLAS and cuDNN.

A fresh `tilestore embed` process spends seconds importing timm, torchvision and what they
import (Python, under the GIL) after torch itself. CUDA's set-up does not need them, and
torch lets go of the GIL while it runs: the driver's context, the cuBLAS and cuDNN handles
and their first kernels are made on a thread meanwhile, where the model's placement and
its first batch would otherwise wait for them (on an H200, from torch imported to the
first forward of ViT-L: 3.05-3.13 s alone, 2.64-2.90 s primed; bench/RESULTS.md "A slide
costs what its model costs, seventh session").

The primer decides nothing: it prepares the device the run will resolve
(`tilestore.embed.settings.resolve_device`, the same rules), and where that fails or
CUDA does, it does nothing: the run meets the same answer and says it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from tilestore.errors import TilestoreError


@contextlib.contextmanager
def primed(device: str = "auto", precision: str = "auto") -> Iterator[None]:
    """Prepare CUDA on a thread while the block runs (imports, the model's loading, the
    run); the thread is joined when the block ends, not before: where CPUs are busy (a
    slide converting beside) it may finish after the imports, and the block waits for it
    only where it reaches CUDA first (torch's own lock on CUDA's set-up). On the CPU, or
    without CUDA, it does nothing."""
    import torch  # here: the block's imports wait for it anyway; the thread then needs none

    thread = threading.Thread(
        target=_prime, args=(torch, device, precision), name="tilestore-gpu-primer", daemon=True
    )
    thread.start()
    try:
        yield
    finally:
        thread.join()


def _prime(torch, device: str, precision: str) -> None:
    """The device the run will resolve (deciding it initialises CUDA, so it is decided
    here too, by the same function), then a few small operations of each library a
    model's first batch calls: cuBLAS(Lt), cuDNN (a convolution: a ViT's patches are one
    too), attention."""
    import torch.nn.functional as F

    from tilestore.embed.settings import resolve_device

    try:
        where, precise = resolve_device(device, precision)
    except TilestoreError:  # the run refuses it, with the same message, where it decides
        return
    if where.type != "cuda":
        return
    dtype = torch.bfloat16 if precise == "bf16" else torch.float32
    with contextlib.suppress(Exception), torch.inference_mode():  # the run says what failed
        square = torch.ones(64, 64, device=where, dtype=dtype)
        square @ square
        image = torch.ones(1, 3, 32, 32, device=where, dtype=dtype)
        F.conv2d(image, torch.ones(8, 3, 4, 4, device=where, dtype=dtype), stride=4)
        query = torch.ones(1, 2, 16, 64, device=where, dtype=dtype)
        F.scaled_dot_product_attention(query, query, query)
