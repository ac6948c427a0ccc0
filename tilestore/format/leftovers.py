"""What killed conversions leave beside their target, found and cleared by the next one.

A conversion builds its store in a hidden folder named for the target, the host and the
process (``.<store>.partial.<host>.<pid>.<token>``) and renames it into place when whole;
replacing a store, it first renames the old one aside (``.<store>.replaced.<token>``). A kill
at any point leaves at most these two. The next conversion into the same folder removes the
partial folders of processes of this host that are gone, puts a store renamed aside back
where its replacement never arrived (nothing the user had is lost), deletes one whose
replacement did arrive, and reports what it cannot judge (another host's partial folders).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

from tilestore.errors import StoreError
from tilestore.format.store import tree_size


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())


def partial_name(target: Path) -> Path:
    """Where a conversion builds `target` before renaming it into place."""
    return target.parent / f".{target.name}.partial.{_host()}.{os.getpid()}.{secrets.token_hex(4)}"


def replaced_name(target: Path) -> Path:
    """Where an old store is moved while its replacement is renamed into place."""
    return target.parent / f".{target.name}.replaced.{secrets.token_hex(4)}"


def clear(target: Path) -> list[str]:
    """Clear what killed conversions of `target` left; return a note for each thing done or
    left alone."""
    notes = []
    for old in sorted(target.parent.glob(f".{target.name}.replaced.*")):
        if target.exists():  # its replacement arrived: the rename aside was the last step left
            shutil.rmtree(old, ignore_errors=True)
            notes.append(f"removed {old.name}, a store already replaced by {target.name}")
        else:  # killed between the two renames: the user's store goes back first
            old.rename(target)
            notes.append(f"restored {target.name} from {old.name} (a replacement was killed)")
    pattern = re.compile(rf"^\.{re.escape(target.name)}\.partial\.(.+)\.(\d+)\.[0-9a-f]+$")
    for partial in sorted(target.parent.glob(f".{target.name}.partial*")):
        match = pattern.match(partial.name)
        if match and match.group(1) == _host() and not _alive(int(match.group(2))):
            size = tree_size(partial)
            shutil.rmtree(partial, ignore_errors=True)
            notes.append(
                f"removed {partial.name}, left by a conversion that was killed "
                f"({size / 2**20:.1f} MB)"
            )
        elif not match or match.group(1) != _host():
            notes.append(
                f"left {partial.name} alone: it may be a conversion running on another host; "
                "delete it if none is"
            )
    return notes


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# a file zarr's local store (or `tilestore.format.shards.write_atomic`) was writing when its
# process was killed: <key>.<32 hex>.partial, never renamed into place
UNFINISHED_FILE = re.compile(r"\.[0-9a-f]{32}\.partial$")


def clear_unfinished_files(folder: Path) -> int:
    """Remove the files killed writers left below `folder` (a group whose writer holds its
    lock); return how many. Their final names still hold what was there before."""
    removed = 0
    for path in folder.rglob("*.partial"):
        if UNFINISHED_FILE.search(path.name) and path.is_file():
            path.unlink(missing_ok=True)
            removed += 1
    return removed


def move_into_place(tmp: Path, target: Path, replace: bool = True) -> None:
    """Rename a store built at `tmp` to `target`; an old store there is renamed aside first
    and deleted last (`clear` puts it back where a kill came between the two renames).
    replace=False: one there (another process's, made meanwhile) is kept, this one refused."""
    if not target.exists():
        tmp.rename(target)
        return
    if not replace:
        raise StoreError(
            f"{target}: made by another process while this one was made; that one is kept"
        )
    old = replaced_name(target)
    target.rename(old)
    tmp.rename(target)
    shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def built_beside(target: Path, failing: str, replace: bool = True) -> Iterator[Path]:
    """Build a store at the partial name this yields; once the block ends, move it into
    place (`move_into_place`; replace=False: never over one made meanwhile). On any failure
    the partial folder is removed and `target` is as it was; an OSError becomes a
    StoreError "<target>: <failing>: <why>"."""
    tmp = partial_name(target)
    try:
        yield tmp
        move_into_place(tmp, target, replace)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise StoreError(f"{target}: {failing}: {exc}") from exc
        raise
