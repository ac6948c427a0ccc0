"""Named ranges for profilers: NVTX, so `nsys profile tilestore embed --profile nvtx ...` shows
our stages by name, and the same names as torch.profiler events (`TorchMarks`).

The ranges go through NVIDIA's NVTX library as torch's CUDA wheels install it (the
`nvidia-nvtx` package's libnvtx3interop), called with ctypes: no torch import, so the
decoder processes name their work too. Where the library is absent (CPU-only torch,
another platform) `load` gives None and nothing is marked. Outside a profiler the calls
cost ~100 ns each; with profiling off (the default) none is made.
"""

from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

ENV = "TILESTORE_NVTX"  # set to 1 in the decoder processes' environment to mark their work
_NAMES = ("libnvtx3interop.so.1", "libnvToolsExt.so.1")


class Nvtx:
    """Push and pop named ranges on the calling thread's NVTX stack."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._push, self._pop = lib.nvtxRangePushA, lib.nvtxRangePop
        self._push.argtypes, self._push.restype = [ctypes.c_char_p], ctypes.c_int
        self._pop.restype = ctypes.c_int
        self._name_thread = getattr(lib, "nvtxNameOsThreadA", None)
        self._names: dict[str, bytes] = {}

    def push(self, name: str) -> None:
        encoded = self._names.get(name)
        if encoded is None:
            encoded = self._names[name] = name.encode()
        self._push(encoded)

    def pop(self) -> None:
        self._pop()

    def name_thread(self, name: str) -> None:
        """Name the calling OS thread in the timeline."""
        if self._name_thread is not None:
            import threading

            self._name_thread(ctypes.c_uint32(threading.get_native_id()), name.encode())


def load() -> Nvtx | None:
    """The NVTX library where one is installed, else None."""
    for path in _candidates():
        try:
            return Nvtx(ctypes.CDLL(str(path)))
        except (OSError, AttributeError):
            continue
    return None


def _candidates() -> list[Path | str]:
    found: list[Path | str] = []
    spec = importlib.util.find_spec("nvidia")  # the namespace package of NVIDIA's wheels
    roots = (spec.submodule_search_locations or []) if spec else []
    for root in roots:
        found += [Path(root) / "nvtx" / "lib" / name for name in _NAMES]
    return [p for p in found if Path(p).exists()] + list(_NAMES)  # then the loader's path


class TorchMarks:
    """The same ranges as torch.profiler `record_function` events (`--profile torch`), so a
    torch trace shows our stages by name too. One stack per thread, as NVTX keeps."""

    def __init__(self) -> None:
        import threading

        self._local = threading.local()

    def push(self, name: str) -> None:
        import torch

        scope = torch.profiler.record_function(name)
        scope.__enter__()
        self._stack().append(scope)

    def pop(self) -> None:
        self._stack().pop().__exit__(None, None, None)

    def _stack(self) -> list:
        if not hasattr(self._local, "stack"):
            self._local.stack = []
        return self._local.stack

    def name_thread(self, name: str) -> None:
        """torch's trace names threads itself."""
