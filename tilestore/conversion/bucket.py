"""A store converted into object storage (s3://, gs://, anything fsspec writes): built here
whole, then uploaded, its root document last.

A conversion writes a store as a local one is written (`built_beside`, in the user's cache:
`TILESTORE_CACHE/building`), then puts each file as one object (a shard whole: an object
appears whole or not at all), many in flight, and the store's root ``zarr.json`` last. A
store without its root document does not open (zarr, tilestore, any OME-Zarr reader), so a
cut upload (a kill, the server gone, a full quota) leaves nothing that reads as a store:
only objects beside `UPLOADING`, the mark put first, which the next conversion to that place
takes for its own and writes over. Where a store is replaced (overwrite), its root document
is removed first, so no reader ever opens a mix of the two, and the old store's objects the
new one lacks are removed before the new root is put.

At the door (`BucketStore.check`), before any slide is read: the place is listed (the
credentials, the bucket, a store there already, or objects that are not one: refused in one
line) and the mark put (a write the bucket refuses is found here, not after the conversion).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from tilestore.caches import user_cache
from tilestore.errors import OptionError, StoreError, TilestoreError
from tilestore.sources.remote import failed_request, storage_options
from tilestore.urls import shown

ROOT = "zarr.json"  # the store's root document: put last, removed first
UPLOADING = ".tilestore-uploading"  # put first, removed last: a cut upload's, ours to replace


@dataclass(frozen=True)
class BucketStore:
    """A store's place in object storage, named by its URL."""

    url: str

    @property
    def building(self) -> Path:
        """Where it is built before its upload: the cache's building/<host>/<path>, a
        place of its own for each URL (a conversion's own partial name beside it)."""
        parts = urlsplit(self.url)
        steps = [s for s in parts.path.split("/") if s not in ("", ".", "..")]
        host = parts.netloc.rpartition("@")[2].replace(":", "_") or "_"
        return user_cache() / "building" / parts.scheme / host / Path(*steps)

    def _fs(self):
        import fsspec

        try:
            fs, root = fsspec.core.url_to_fs(self.url, **storage_options(self.url))
        except (ImportError, ValueError) as exc:
            raise StoreError(
                f"{shown(self.url)}: cannot write {urlsplit(self.url).scheme}:// URLs: {exc}"
            ) from None
        return fs, root.rstrip("/")

    def stored_bytes(self) -> int:
        """The bytes of its objects (`tilestore info`'s size)."""
        fs, root = self._fs()
        try:
            return int(fs.du(root))
        except Exception as exc:  # each store's own errors, said in one line
            raise failed_request(self.url, exc, StoreError, "list the store") from None

    def check(self, overwrite: bool) -> None:
        """Refuse, in one line, a place that cannot take the store: not reachable or not
        allowed, a store there (unless overwrite), objects there that are not a store nor
        a cut upload's; then put the mark (a bucket that refuses writes is found now)."""
        fs, root = self._fs()
        try:
            fs.invalidate_cache()
            found = set(fs.find(root))
            mine = root + "/" + ROOT in found and _a_store(fs.cat_file(root + "/" + ROOT))
        except TilestoreError:
            raise
        except Exception as exc:  # each store's own errors, said in one line
            raise failed_request(self.url, exc, StoreError, "list the store's place") from None
        if root + "/" + ROOT in found:
            if not mine:  # never replaced: it may be anything of the user's
                raise StoreError(
                    f"{shown(self.url)}: objects that are not a tilestore store are in the "
                    "store's place; remove them or choose another output"
                )
            if not overwrite:
                raise StoreError(
                    f"{shown(self.url)}: already exists; pass overwrite=True to replace it"
                )
        elif found and root + "/" + UPLOADING not in found:
            raise StoreError(
                f"{shown(self.url)}: objects that are not a tilestore store are in the store's "
                "place; remove them or choose another output"
            )
        mark = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}
        try:
            fs.pipe_file(root + "/" + UPLOADING, json.dumps(mark).encode())
        except Exception as exc:
            raise failed_request(self.url, exc, StoreError, "write there") from None

    def upload(self, local: Path, replace: bool) -> int:
        """Put the store built at `local` here (its root document last), replacing one here
        where `replace`; the number of objects put. StoreError in one line where the
        upload fails: what was put stays beside the mark, for the next conversion."""
        fs, root = self._fs()
        files = {p.relative_to(local).as_posix(): p for p in local.rglob("*") if p.is_file()}
        first = files.pop(ROOT)
        keys = [f"{root}/{key}" for key in files]
        try:
            if replace and fs.exists(f"{root}/{ROOT}"):
                fs.rm_file(f"{root}/{ROOT}")  # no longer a store: never read half replaced
            fs.put([str(p) for p in files.values()], keys)
            fs.invalidate_cache()
            left = set(fs.find(root)) - set(keys) - {f"{root}/{ROOT}", f"{root}/{UPLOADING}"}
            if left:  # the old store's, or a cut upload's, that this store has not
                fs.rm(sorted(left))
            fs.put_file(str(first), f"{root}/{ROOT}")
            fs.rm_file(f"{root}/{UPLOADING}")
        except Exception as exc:
            raise failed_request(self.url, exc, StoreError, "upload the store") from None
        return len(keys) + 1

    def abandon(self) -> None:
        """After a conversion failed before its upload: the mark removed where no store is
        here (nothing of this run left that a listing shows); the built copy removed."""
        shutil.rmtree(self.building, ignore_errors=True)
        top, folder = user_cache() / "building", self.building.parent
        while folder != top and top in folder.parents:  # its empty folders too
            with contextlib.suppress(OSError):
                folder.rmdir()  # not empty: another conversion's
            folder = folder.parent
        try:
            fs, root = self._fs()
            found = set(fs.find(root))
            if found == {f"{root}/{UPLOADING}"}:
                fs.rm_file(f"{root}/{UPLOADING}")
        except Exception:  # the server gone: the mark says what it is to the next run
            pass


@contextlib.contextmanager
def built_for(place: Path | str, overwrite: bool) -> Iterator[Path]:
    """Where the store bound for `place` is built: `place` itself (a local path) or, for a
    bucket's URL, a copy in the cache (`BucketStore.building`), uploaded once the block has
    ended whole: the place checked and marked first, the copy removed in any case, and the
    mark too where nothing was put."""
    if not isinstance(place, str):
        yield place
        return
    bucket = BucketStore(place)
    bucket.check(overwrite)
    shutil.rmtree(bucket.building, ignore_errors=True)  # a cut upload's copy
    try:
        yield bucket.building
        bucket.upload(bucket.building, replace=overwrite)
    finally:
        bucket.abandon()


def no_sidecars_there(place: Path | str, option: str) -> None:
    """OptionError where in-place sidecars would go to a bucket: a sidecar reads its slide
    where it is, and is written into a local folder."""
    if isinstance(place, str):
        raise OptionError(
            f"{option} {shown(place)}: a bucket; in-place sidecars read each slide where it "
            "is and are written to a local folder"
        )


def _a_store(document: bytes) -> bool:
    """Whether a root document is a tilestore store's (its record), not any zarr group."""
    try:
        return "tilestore" in json.loads(document).get("attributes", {})
    except (ValueError, AttributeError):
        return False


def store_url(dst: str, name: str) -> str:
    """The store's URL `convert(src, dst)` writes: dst itself where it names a .zarr, else
    dst/<name>."""
    base = dst.rstrip("/")
    return base if base.endswith(".zarr") else f"{base}/{name}"
