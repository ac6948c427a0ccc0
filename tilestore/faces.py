"""Package faces whose members load on first use.

Every package's `__init__` lists what users may import and loads each name from its module
only when it is first asked for, so importing a light module (`tilestore.errors`, the
decoder workers' `tilestore.embed.procdecode`) never pays for zarr, dask, xarray or torch.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def lazy_face(
    package: str, members: Mapping[str, tuple[str, ...]]
) -> tuple[Callable[[str], object], Callable[[], list[str]], list[str]]:
    """The face's `__getattr__`, `__dir__` and `__all__`, from {module: names it defines}."""
    where = {name: module for module, names in members.items() for name in names}

    def __getattr__(name: str) -> object:
        if name in where:
            return getattr(importlib.import_module(where[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *where})

    return __getattr__, __dir__, sorted(where)
