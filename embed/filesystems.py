"""The file systems a run found it cannot write into: one that is full, over its quota or
read-only (`tilestore.format.store.WriteFault.filesystem`) fails every store on it alike, so
a run stops there: the stores on it not begun yet are not attempted (their tiles never
computed), each said in one line; stores on other file systems go on. A store's own fault
(no permission, a file in the way) fails that store alone.

One record for every way a cohort runs: the one-process engine (its writer thread records,
its producer, GPU loop and writer ask) and a Dask cohort's coordinator.
"""

from __future__ import annotations

import os
from pathlib import Path

from tilestore.errors import WriteFailed


class FileSystems:
    """The file systems (by device, st_dev) a run's writes found full, over quota or
    read-only, each with the store and the error that found it."""

    def __init__(self) -> None:
        self._lost: dict[int, tuple[str, WriteFailed]] = {}
        self._written: set[int] = set()  # a store's group was made on these

    def wrote(self, store: str | os.PathLike) -> None:
        """A store's group was made: its file system took a run's writes."""
        device = _device(store)
        if device is not None:
            self._written.add(device)

    def proven(self, store: str | os.PathLike) -> bool:
        """Whether a store's group was made on the file system of `store` in this run: until
        one was, a run opens the stores on it one at a time, so a full or read-only one is
        found by the first and the others are not attempted."""
        return _device(store) in self._written

    def hit(self, store: str | os.PathLike, error: WriteFailed) -> None:
        """A write into `store` failed: where it is the file system's fault, remember it."""
        fault = error.fault
        device = _device(store)
        if getattr(fault, "filesystem", False) and device is not None:
            self._lost.setdefault(device, (str(store), error))

    def refusal(self, store: str | os.PathLike) -> WriteFailed | None:
        """Why `store` is not attempted (its file system is one a write found full, over
        quota or read-only; read-only: where the store's own mount is, a read-only bind
        mount sharing the device of a writable one), or None."""
        if not self._lost:
            return None
        device = _device(store)
        if device is None or device not in self._lost:
            return None
        first, error = self._lost[device]
        fault = error.fault
        if fault.code == "EROFS" and not _read_only(store):
            return None
        return WriteFailed(
            f"{store}: not attempted: its file system is {fault.state} (writing into {first} "
            f"failed: {fault.cause}); {fault.fix}",
            fault,
        )


def _device(store: str | os.PathLike) -> int | None:
    """The device of the store's folder (of the folder it is made in, where it is not made
    yet); None where neither can be read."""
    try:  # a run asks this of each slide twice: no Path made where the store is there
        return os.stat(store).st_dev
    except OSError:
        pass
    try:
        return os.stat(Path(store).parent).st_dev
    except OSError:
        return None


def _read_only(store: str | os.PathLike) -> bool:
    try:
        return bool(os.statvfs(store).f_flag & os.ST_RDONLY)
    except OSError:
        return False
