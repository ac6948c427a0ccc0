"""A compiled model kept between processes: torch's portable cache artifacts, one file per
model, shapes, precision, GPU and software versions.

`torch.compile` spends 10-20 s on a ViT before the first batch; a SLURM array whose tasks
each embed one slide would pay that in every task. After the first compilation the
artifacts (Inductor's compiled graphs and autotuning results, `torch.compiler.
save_cache_artifacts`) are written to the cache folder; a later process loads them before
compiling (`load_cache_artifacts`), so Inductor finds its work done. The folder defaults to
the user's cache; on a cluster, a shared file system (`--compile-cache DIR`) serves every
node. Each file has a JSON sidecar with its key and the artifacts' SHA-256: an entry whose
key or bytes do not match, or that torch refuses, is ignored with a note and replaced.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch


def cache_key(model: dict[str, Any], batch: int, read: int, precision: str, device) -> dict:
    """Everything a compiled graph depends on: the model and its weights' identity, the
    batch's shape, precision, the device and the software that compiled it."""
    cuda = torch.device(device).type == "cuda"
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "model": {k: model.get(k) for k in ("name", "repo", "revision", "weights", "transform")},
        "input": [batch, read, read, 3],
        "precision": precision,
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "capability": list(torch.cuda.get_device_capability(device)) if cuda else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton_version,
    }


class CompileCache:
    """The cache entry for one key in `folder`."""

    def __init__(self, folder: Path, key: dict) -> None:
        self.key = key
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
        self.path = Path(folder) / f"{key['model']['name'].replace('/', '-')}-{digest}.bin"
        self.sidecar = self.path.with_suffix(".json")
        self.loaded = False

    def load(self) -> str:
        """Load the entry's artifacts into torch's caches (before compiling); say what
        happened, for the report."""
        if not self.path.exists():
            return f"compile cache: none yet at {self.path.parent}"
        try:
            meta = json.loads(self.sidecar.read_text())
            data = self.path.read_bytes()
        except (OSError, ValueError) as exc:
            return f"compile cache: {self.path} ignored (unreadable: {exc}); compiled afresh"
        if meta.get("key") != self.key:
            return f"compile cache: {self.path} ignored (made for another model, shape or software)"
        if meta.get("sha256") != hashlib.sha256(data).hexdigest():
            return f"compile cache: {self.path} ignored (its bytes changed since written)"
        try:
            torch.compiler.load_cache_artifacts(data)
        except Exception as exc:  # torch's own checks (versions, format) refuse it
            return f"compile cache: {self.path} ignored (torch refused it: {exc})"
        self.loaded = True
        return f"compile cache: loaded {self.path} (made {meta.get('made', '?')})"

    def save(self) -> str | None:
        """After the first compilation: write the artifacts (atomically; another task may
        write the same entry at once). None where there is nothing new to write."""
        if self.loaded:
            return None
        try:
            artifacts = torch.compiler.save_cache_artifacts()
        except Exception as exc:
            return f"compile cache: not saved ({type(exc).__name__}: {exc})"
        if not artifacts:
            return "compile cache: torch had no artifacts to save"
        data = artifacts[0]
        meta = {
            "key": self.key,
            "sha256": hashlib.sha256(data).hexdigest(),
            "made": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "bytes": len(data),
        }
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            for target, content in ((self.path, data), (self.sidecar, json.dumps(meta, indent=1))):
                tmp = target.with_name(f".{target.name}.{os.getpid()}")
                tmp.write_bytes(content if isinstance(content, bytes) else content.encode())
                os.replace(tmp, target)
            return f"compile cache: saved {self.path} ({len(data) / 2**20:.1f} MB)"
        return f"compile cache: could not write {self.path}"
