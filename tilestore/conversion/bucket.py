"""A store converted into object storage (s3://, gs://, az://): built here whole, then
uploaded, its root document last.

A conversion writes a store as a local one is written (`built_beside`, in a folder of its own
under the user's cache: `TILESTORE_CACHE/building/<run>`), then puts each file as one object
(a shard whole: an object appears whole or not at all), many in flight, and the store's root
``zarr.json`` last. A store without its root document does not open (zarr, tilestore, any
OME-Zarr reader), so a cut upload (a kill, the server gone, a full quota) leaves nothing that
reads as a store: only objects beside the mark (`MARK`), which a later conversion to that
place takes over once its writer is gone, and writes over. Where a store is replaced
(overwrite), its root document is removed first, so no reader ever opens a mix of the two,
and the old store's objects the new one lacks are removed before the new root is put.

The mark says who converts into the place (a lock's holder: `tilestore.locks.Holder`, with a
token of the run), beating every `locks.HEARTBEAT` s while the run lasts: a mark whose writer
runs (this host's process alive, another host's mark beating) is refused in one line, as a
local store's lock is; one whose writer is gone is taken over. The run puts its mark, reads
it back (two runs putting at once: the last one's stands, the other stops), and reads it
again before its first object and before the root document.

At the door (`BucketStore.check`), before the slide is staged or read: the place listed (the
credentials, the bucket, a store there already, objects that are not one, a run converting
into it: refused in one line) and the mark put (a bucket that refuses writes is found here).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from tilestore import locks
from tilestore.caches import user_cache
from tilestore.errors import OptionError, StoreError, TilestoreError
from tilestore.sources.remote import PART_STALE_S, failed_request, storage_options
from tilestore.urls import shown

ROOT = "zarr.json"  # the store's root document: put last, removed first
MARK = ".tilestore-uploading"  # put first, removed last: who converts into the place
PROBE = ".tilestore-probe-"  # + a run's token: the door's write tried (not a store's object)


def store_url(dst: str, name: str) -> str:
    """The store's URL `convert(src, dst)` writes: dst itself where it names a .zarr, else
    dst/<name> (`dst` a URL `tilestore.urls.store_written` takes). OptionError in one line
    for one that is not a place in a bucket: a user, password, query or fragment, an
    empty, . or .. step."""
    base = dst.rstrip("/")
    url = base if base.endswith(".zarr") else f"{base}/{name}"
    parts = urlsplit(url)
    steps = parts.path.split("/")[1:]
    why = None
    if "@" in parts.netloc or parts.query or parts.fragment:
        why = "a store's URL names no user, password, query or fragment (credentials come "
        why += "from the provider's chain: the environment, profiles)"
    elif not parts.netloc or not steps or any(s in ("", ".", "..") for s in steps):
        why = "not a store's place in a bucket (bucket/prefix/<name>.ome.zarr: no empty, "
        why += ". or .. step)"
    if why is not None:
        raise OptionError(f"{shown(url)}: {why}")
    return url


@dataclass
class BucketStore:
    """A store's place in object storage, named by its URL, as one run converts into it."""

    url: str
    token: str = field(default_factory=lambda: secrets.token_hex(8))
    uploaded: bool = False  # the store put whole, its root document last
    since: float = field(default_factory=time.time)
    _beating: threading.Event | None = None

    def _mark(self, ended: bool = False) -> bytes:
        """This run's mark: who, since when, its last beat (now), its token, and whether the
        run has ended (its upload cut: the place is the next run's)."""
        me = locks.Holder.me(lambda: self.since)
        mark = {**asdict(me), "beat": locks.Holder.me().beat, "token": self.token}
        return json.dumps({**mark, "ended": ended}).encode()

    @property
    def building(self) -> Path:
        """Where this run builds the store before its upload: a folder of its own, named
        by who builds it (host, pid: `_clear_stale_copies` knows a killed run's by it)."""
        run = f"{socket.gethostname()}.{os.getpid()}.{self.token}"
        return user_cache() / "building" / run / Path(urlsplit(self.url).path).name

    def _fs(self):
        import fsspec

        try:
            fs, root = fsspec.core.url_to_fs(self.url, **storage_options(self.url))
        except (ImportError, ValueError) as exc:
            raise StoreError(
                f"{shown(self.url)}: cannot write {urlsplit(self.url).scheme}:// URLs: {exc}"
            ) from None
        return fs, root.rstrip("/")

    def _listed(self, fs, root: str) -> set[str]:
        """The place's objects (below it: never the prefix itself, which a listing may give
        as a folder), but the doors' probes (another run's, under way)."""
        fs.invalidate_cache()
        return {
            key
            for key in fs.find(root)
            if key.startswith(f"{root}/") and not key.rpartition("/")[2].startswith(PROBE)
        }

    def _read_mark(self, fs, root: str) -> tuple[locks.Holder, str, bool] | None:
        """The mark there (None: none, or gone meanwhile)."""
        try:
            return _holder(fs.cat_file(f"{root}/{MARK}"))
        except FileNotFoundError:
            return None

    def check(self, overwrite: bool) -> None:
        """Refuse, in one line, a place that cannot take the store (`look`); then put this
        run's mark, read it back, and keep it beating (a bucket that refuses writes is found
        now)."""
        fs, root = self.look(overwrite)
        self._put_mark(fs, root)
        self._beating = threading.Event()
        threading.Thread(target=self._beat, args=(self._beating,), daemon=True).start()

    def probe(self, overwrite: bool) -> None:
        """`look`, then a write and a removal tried (a bucket that refuses either is found
        before any slide is staged): an empty object of this run's put and removed."""
        fs, root = self.look(overwrite)
        probe = f"{root}/{PROBE}{self.token}"  # an object of its own: no other run's mark
        try:
            fs.pipe_file(probe, b"")
            fs.rm_file(probe)
        except Exception as exc:
            raise failed_request(self.url, exc, StoreError, "write there") from None

    def look(self, overwrite: bool):
        """Refuse, in one line, a place that cannot take the store: not reachable or not
        allowed, a store there (unless overwrite), objects there that are not a store nor a
        cut upload's, a run converting into it. Nothing written; its filesystem and root."""
        fs, root = self._fs()
        for _ in range(3):  # a mark listed but gone when read: its run ended meanwhile
            try:
                found = self._listed(fs, root)
                mark = self._read_mark(fs, root) if f"{root}/{MARK}" in found else None
                try:
                    store = f"{root}/{ROOT}" in found and _a_store(fs.cat_file(f"{root}/{ROOT}"))
                except FileNotFoundError:  # the root removed meanwhile: an overwrite began
                    continue
            except Exception as exc:  # each store's own errors, said in one line
                raise failed_request(self.url, exc, StoreError, "list the store's place") from None
            if mark is not None or f"{root}/{MARK}" not in found:
                break  # else it ended between the listing and the reading: look again
        else:
            raise StoreError(f"{shown(self.url)}: changing as it is looked at; run again")
        if not store and (f"{root}/{ROOT}" in found or (found and mark is None)):
            raise StoreError(  # never replaced: they may be anything of the user's
                f"{shown(self.url)}: objects that are not a tilestore store are in the store's "
                "place; remove them or choose another output"
            )
        if mark is not None and not mark[2]:  # a mark whose run has not said it ended
            self._refuse_running(mark[0], fs, root)
        if store and not overwrite:
            raise StoreError(
                f"{shown(self.url)}: already exists; pass overwrite=True to replace it"
            )
        return fs, root

    def _refuse_running(self, holder: locks.Holder, fs, root: str) -> None:
        """StoreError where the mark's writer may still be converting into the place."""
        if locks.gone(holder, time.time()) is None:
            raise StoreError(
                f"{shown(self.url)}: being converted into by pid {holder.pid} on {holder.host} "
                f"since {holder.since}{locks.describe(holder, time.time())}; if that run is "
                f"dead, remove {shown(self.url)}/{MARK} (a mark silent for "
                f"{locks.span(locks.STALE)} is taken over)"
            )

    def _put_mark(self, fs, root: str) -> None:
        """Put this run's mark (a beat), then read it back: ours, or another run's put
        meanwhile (StoreError: that run converts into the place)."""
        try:
            fs.pipe_file(f"{root}/{MARK}", self._mark())
        except Exception as exc:
            raise failed_request(self.url, exc, StoreError, "write there") from None
        self._ours(fs, root)

    def _ours(self, fs, root: str) -> None:
        """StoreError where the mark is no longer this run's (another run took the place)."""
        try:
            found = self._read_mark(fs, root)
        except Exception as exc:
            raise failed_request(self.url, exc, StoreError, "read its mark") from None
        if found is None or found[1] != self.token:
            who = found[0].name if found is not None else "another run"
            raise StoreError(
                f"{shown(self.url)}: {who} converts into it too (its mark replaced this "
                "run's); this run stops, that one goes on"
            )

    def _beat(self, stop: threading.Event) -> None:
        fs, root = self._fs()
        while not stop.wait(locks.HEARTBEAT):
            with contextlib.suppress(Exception):  # a beat missed: the next one comes
                fs.pipe_file(f"{root}/{MARK}", self._mark())

    def upload(self, local: Path, replace: bool) -> int:
        """Put the store built at `local` here (its root document last), replacing one here
        where `replace`; the number of objects put. StoreError in one line where the
        upload fails: what was put stays beside the mark, for the next conversion."""
        fs, root = self._fs()
        files = {p.relative_to(local).as_posix(): p for p in local.rglob("*") if p.is_file()}
        first = files.pop(ROOT)
        keys = [f"{root}/{key}" for key in files]
        try:
            self._ours(fs, root)
            if not replace and fs.exists(f"{root}/{ROOT}"):  # made meanwhile: kept
                raise StoreError(
                    f"{shown(self.url)}: made by another run while this one converted; that "
                    "one is kept"
                )
            if replace and fs.exists(f"{root}/{ROOT}"):
                fs.rm_file(f"{root}/{ROOT}")  # no longer a store: never read half replaced
            fs.put([str(p) for p in files.values()], keys)
            left = self._listed(fs, root) - set(keys) - {f"{root}/{ROOT}", f"{root}/{MARK}"}
            if left:  # the old store's, or a cut upload's, that this store has not
                fs.rm(sorted(left))
            self._ours(fs, root)
            fs.put_file(str(first), f"{root}/{ROOT}")
        except TilestoreError:
            raise
        except Exception as exc:
            raise failed_request(self.url, exc, StoreError, "upload the store") from None
        self.uploaded = True
        self._stop_beating()
        with contextlib.suppress(Exception):  # the store is whole: a mark left goes stale
            fs.rm_file(f"{root}/{MARK}")
        return len(keys) + 1

    def _stop_beating(self) -> None:
        if self._beating is not None:
            self._beating.set()

    def abandon(self) -> None:
        """Once the conversion has ended (well or not): this run's copy removed (and any
        copy a killed run left for a day); its mark, where it is still there, removed where
        the place holds the store as it was (or nothing), else said ended: it claims a cut
        upload's objects for the next run, which takes the place at once."""
        self._stop_beating()
        shutil.rmtree(self.building.parent, ignore_errors=True)
        _clear_stale_copies(user_cache() / "building")
        if self._beating is None or self.uploaded:  # no mark of this run's there
            return
        with contextlib.suppress(Exception):  # the server gone: the mark, silent, goes stale
            fs, root = self._fs()
            found = self._listed(fs, root)
            self._ours(fs, root)
            if f"{root}/{ROOT}" in found or found == {f"{root}/{MARK}"}:
                fs.rm_file(f"{root}/{MARK}")  # the store as it was, or nothing: no mark
            else:  # a cut upload's objects: the mark claims them, its run ended
                fs.pipe_file(f"{root}/{MARK}", self._mark(ended=True))

    def stored_bytes(self) -> int | None:
        """The bytes of its objects (`tilestore info`'s size); None where they cannot be
        listed (a store read without the right to list)."""
        fs, root = self._fs()
        try:
            return int(fs.du(root))
        except Exception:
            return None


@contextlib.contextmanager
def built_for(place: Path | str, overwrite: bool) -> Iterator[Path]:
    """Where the store bound for `place` is built: `place` itself (a local path) or, for a
    bucket's URL, a copy of this run's in the cache, uploaded once the block has ended
    whole: the place checked and marked first (before the block: the slide staged within
    it), the copy removed in any case, the mark too where nothing was put."""
    if not isinstance(place, str):
        yield place
        return
    bucket = BucketStore(place)
    bucket.check(overwrite)
    try:
        yield bucket.building
        bucket.upload(bucket.building, replace=overwrite)
    finally:
        bucket.abandon()


def check_places(places: list[Path | str], overwrite: bool) -> None:
    """The door of a cohort's conversion: each place in a bucket looked at and a write
    tried (`probe`: one line for the first that cannot take its store), before any slide
    is staged or read."""
    for place in places:
        if isinstance(place, str):
            BucketStore(place).probe(overwrite)


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


def _holder(document: bytes) -> tuple[locks.Holder, str, bool] | None:
    """A mark's writer, token, and whether its run ended (None: not a mark this version
    reads)."""
    try:
        said = json.loads(document)
        holder = locks.Holder(
            said.get("host"), said.get("pid"), said.get("since"), said.get("beat"), None
        )
        return holder, str(said.get("token")), bool(said.get("ended"))
    except (ValueError, AttributeError, TypeError):
        return None


def _clear_stale_copies(folder: Path) -> None:
    """Remove the copies killed runs left: this host's whose process is gone; another
    host's (a cache its cluster shares) a week old. A run's copy is named host.pid.token."""
    with contextlib.suppress(OSError):
        for copy in folder.iterdir():
            host, pid, _ = copy.name.rsplit(".", 2) if copy.name.count(".") >= 2 else ("", "", "")
            holder = locks.Holder(host, int(pid) if pid.isdigit() else None, None)
            killed = host == socket.gethostname() and holder.pid and locks.gone(holder, time.time())
            if killed or time.time() - copy.stat().st_mtime > 7 * PART_STALE_S:
                shutil.rmtree(copy, ignore_errors=True)
