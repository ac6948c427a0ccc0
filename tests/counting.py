"""A zarr store wrapper that records every key read and its size: proof of what a read touched."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from zarr.abc.store import ByteRequest
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import LocalStore, WrapperStore


@dataclass
class ReadLog:
    reads: list[tuple[str, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def chunk_keys(self, array_path: str | None = None) -> list[str]:
        """Keys of chunk reads (not metadata), optionally of one array."""
        prefix = f"{array_path}/c/" if array_path is not None else None
        return [k for k, _ in self.reads if "/c/" in k and (prefix is None or k.startswith(prefix))]

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
        return cls(LocalStore(path, read_only=True))

    def _with_store(self, store):
        return type(self)(store, self.log)

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        buf = await self._store.get(key, prototype, byte_range)
        with self.log.lock:
            self.log.reads.append((key, 0 if buf is None else len(buf)))
        return buf
