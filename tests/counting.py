"""A zarr store wrapper that records every key read and its size: proof of what a read touched.

In a sharded array a chunk is a byte range of its shard: the log names it by its own key
(<array>/c/0/<row>/<col>), found from the shard's index; reads of an index are not chunks."""

from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from zarr.abc.store import ByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import LocalStore, WrapperStore


@dataclass
class ReadLog:
    reads: list[tuple[str, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    root: Path | None = None  # the local store, to name a shard's inner chunks

    def chunk_keys(self, array_path: str | None = None) -> list[str]:
        """Keys of chunk reads (not metadata, shard indexes, nor a chunk's last bytes alone),
        optionally of one array."""
        prefix = f"{array_path}/c/" if array_path is not None else None
        return [
            k
            for k, _ in self.reads
            if "/c/" in k
            and not k.endswith(("(index)", "(end)"))
            and (prefix is None or k.startswith(prefix))
        ]

    def ends(self, array_path: str) -> list[tuple[str, int]]:
        """Reads of a chunk's last bytes alone (its CRC-32C, compared with its position) of
        one array: (the chunk's key, bytes)."""
        prefix = f"{array_path}/c/"
        return [(k[: -len(" (end)")], n) for k, n in self.reads
                if k.startswith(prefix) and k.endswith("(end)")]  # fmt: skip

    def named(self, key: str, byte_range: ByteRequest | None) -> str:
        """The key a read is logged under: a shard's byte range named as its inner chunk."""
        if isinstance(byte_range, SuffixByteRequest):
            return f"{key} (index)"
        if not isinstance(byte_range, RangeByteRequest) or self.root is None:
            return key
        from tilestore.format.shards import parse_index

        path, at = key.split("/c/", 1)
        meta = json.loads((self.root / path / "zarr.json").read_text())  # no zarr: in its loop
        sharding = meta["codecs"][0]["configuration"]
        outer = meta["chunk_grid"]["configuration"]["chunk_shape"]
        per = [o // i for o, i in zip(outer, sharding["chunk_shape"], strict=True)]
        crc = any(c["name"] == "crc32c" for c in sharding["index_codecs"])
        index = parse_index((self.root / key).read_bytes(), math.prod(per), key, crc)
        shard = [int(i) for i in at.split("/")]
        starts, ends = index[:, 0], index[:, 0] + index[:, 1]
        (inner,) = np.flatnonzero((starts <= byte_range.start) & (byte_range.start < ends))
        coord = [
            s * p + i for s, p, i in zip(shard, per, np.unravel_index(inner, per), strict=True)
        ]
        whole = byte_range.start == starts[inner]  # else its last bytes alone: its CRC-32C
        return f"{path}/c/" + "/".join(str(int(c)) for c in coord) + ("" if whole else " (end)")

    def chunk_bytes(self) -> int:
        return sum(n for k, n in self.reads if "/c/" in k)

    def clear(self) -> None:
        with self.lock:
            self.reads.clear()


class CountingStore(WrapperStore):
    """Delegates to a store and logs each get (key, bytes returned)."""

    def __init__(self, store, log: ReadLog | None = None) -> None:
        super().__init__(store)
        self.log = log if log is not None else ReadLog()

    @classmethod
    def local(cls, path) -> CountingStore:
        return cls(LocalStore(path, read_only=True), ReadLog(root=Path(path)))

    def _with_store(self, store):
        return type(self)(store, self.log)

    async def getsize(self, key: str) -> int:
        """The store's own answer (zarr's default would read the value whole, through get)."""
        return await self._store.getsize(key)

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        buf = await self._store.get(key, prototype, byte_range)
        name = self.log.named(key, byte_range)
        with self.log.lock:
            self.log.reads.append((name, 0 if buf is None else len(buf)))
        return buf
