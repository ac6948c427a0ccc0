"""The tilestore store on disk: where things live, how a store is opened and recognised.

A store is an OME-Zarr 0.5 image group. Besides the OME metadata its
attributes hold a ``tilestore`` block: source facts with their origin, per-level
provenance, software versions and a ``complete`` flag written last. Derived
data live beside the image: ``labels/tissue``, ``plans/<name>``,
``embeddings/<model>``.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from urllib.parse import urlsplit

import zarr
from zarr.abc.store import Store

from tilestore.errors import OptionError, StoreError, WriteFailed
from tilestore.format.record import ATTRS_KEY, StoreRecord
from tilestore.format.records import write_record  # noqa: F401  (the one writer, for every record)
from tilestore.format.shards import write_atomic
from tilestore.urls import is_dicomweb, is_url, named

STORE_FORMAT = 1
STORE_SUFFIX = ".ome.zarr"


def software_versions(*packages: str) -> dict[str, str]:
    """Return installed versions of tilestore and the named packages."""
    return dict(_versions(packages))


@functools.cache
def _versions(packages: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """Read once a process: importlib.metadata parses each distribution's METADATA file
    (25 ms for seven packages), and a run records them in every store it writes."""
    found = {}
    for name in ("tilestore", "zarr", "numpy", *packages):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return tuple(found.items())


def is_store(path: str | os.PathLike) -> bool:
    """True if path is a zarr v3 group directory (a store or something that looks like one)."""
    return (Path(path) / "zarr.json").is_file()


def store_name(source: str | os.PathLike) -> str:
    """Return the store name for a source: ``slide.svs`` -> ``slide.ome.zarr``; a folder (of
    DICOM files) -> ``<folder>.ome.zarr``, as `convert` names it; a URL's: its path's last
    step, its query aside; a DICOMweb series': its UID."""
    if is_dicomweb(str(source)):  # a DICOMweb series: by its UID, as a folder by its name
        return urlsplit(str(source)).path.rstrip("/").rpartition("/")[2] + STORE_SUFFIX
    if not is_url(source) and Path(source).is_dir():  # a DICOM folder: its whole name (a
        return Path(source).name + STORE_SUFFIX  # series UID's dots are not a suffix)
    name = Path(urlsplit(source).path if "://" in str(source) else source).name
    for suffix in (".ome.tiff", ".ome.tif"):
        if name.lower().endswith(suffix):
            return name[: -len(suffix)] + STORE_SUFFIX
    return Path(name).stem + STORE_SUFFIX


def one_store_each(inputs: Iterable[tuple[Path, str | None, Path | str]]) -> list[int]:
    """Which inputs to take, where two would be one store. `inputs`: each input (a file, a
    folder; with its series, where a DICOM folder holds several) and the store it would
    write: itself, the store it converts into, its sidecar. An input given again (the same
    file, by one path or another: `..`, a link) is taken once, as on Dask; two others bound
    for one store are an OptionError, before anything is done (the second would find the
    first's store made, or its lock held by its own run). The indices of those to take."""
    seen: dict[str, tuple[Path, str | None]] = {}
    taken = []
    for index, (given, series, store) in enumerate(inputs):
        where = store if is_url(store) else os.path.realpath(store)  # a bucket's: its URL
        if where not in seen:
            seen[where] = (given, series)
            taken.append(index)
            continue
        first, first_series = seen[where]
        same = _same_input(first, given)
        if same and first_series == series:
            continue  # given again: taken once
        given, first = named(given), named(first)  # a URL without its secrets
        if same:
            raise OptionError(
                f"{given}: its series {series} would be written into {store}, as series "
                f"{first_series}: give a folder, where each series gets a store of its own"
            )
        raise OptionError(
            f"{given}: its store would be {store}, as {first}'s: each needs a store of its "
            "own (slides of one name: a folder each)"
        )
    return taken


def _same_input(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """The same input: one file by any path (`..`, a link); a URL by its text."""
    if is_url(a) or is_url(b):
        return str(a) == str(b)
    return os.path.realpath(a) == os.path.realpath(b)


def remote_store(store: Store) -> bool:
    """Whether a zarr store reads its objects over a network (zarr's FsspecStore on any file
    system but the local one, its ObjectStore): a store there is read where it is, and
    written only whole (`tilestore.conversion.bucket`), never a group at a time."""
    if type(store).__name__ == "ObjectStore":
        return True
    if not isinstance(store, zarr.storage.FsspecStore):
        return False
    protocol = store.fs.protocol
    return not {"file", "local"} & set(
        protocol if isinstance(protocol, tuple | list) else [protocol]
    )


def open_store(path: str | os.PathLike, mode: str = "r") -> tuple[zarr.Group, StoreRecord]:
    """Open a complete store at a path; return its root group and its record of itself."""
    path = Path(path)
    if not path.exists():
        raise StoreError(f"{path}: no such store")
    if not is_store(path):
        hint = " (a slide file: convert it, or read it in place)" if path.is_file() else ""
        raise StoreError(f"{path}: not a tilestore store{hint}")
    return open_group(path, mode=mode)


def open_group(
    where: str | os.PathLike | Store, *, mode: str = "r", complete: bool = True
) -> tuple[zarr.Group, StoreRecord]:
    """A store's root group (at a path, or any zarr v3 store object) and its record of
    itself (`StoreRecord`, checked): the one place a group is opened and recognised as ours.
    StoreError where it cannot be opened, was not made by tilestore, its record is damaged,
    or (complete=True) it is unfinished."""
    try:
        group = zarr.open_group(where, mode=mode, zarr_format=3, use_consolidated=False)
    except (FileNotFoundError, OSError, *DAMAGED) as exc:
        raise StoreError(f"{where}: cannot open store: {exc}") from exc
    attrs = group.attrs.get(ATTRS_KEY)
    if not isinstance(attrs, dict):
        raise StoreError(f"{where}: zarr group without tilestore metadata (not made by tilestore)")
    record = StoreRecord.parse(attrs, where)
    if complete and not record.complete:
        raise StoreError(
            f"{where}: incomplete store (conversion was interrupted); convert again with "
            "overwrite=True"
        )
    return group, record


# how a stored document (a zarr.json: its JSON, its zarr metadata, its attributes' types)
# fails when read: not valid JSON (a ValueError), not valid metadata, not of the types written
DAMAGED = (ValueError, TypeError, AttributeError, KeyError, IndexError, zarr.errors.BaseZarrError)


def members(group: zarr.Group) -> list[tuple[str, zarr.Array | zarr.Group]]:
    """A group's members (name, node), their metadata read concurrently, sorted by name; a
    member whose zarr.json zarr cannot parse (a data type its fill value does not fit, say)
    is a ValueError naming it, where zarr's own error says neither the member nor the file."""
    try:
        return sorted(group.members(), key=lambda m: m[0])
    except DAMAGED as exc:
        found = exc
    from zarr.core.sync import sync

    async def names() -> list[str]:
        return [name async for name in group.store.list_dir(group.path)]

    for name in sorted(n for n in sync(names()) if n != "zarr.json"):
        try:
            group[name]
        except DAMAGED as exc:
            raise ValueError(
                f"{name}/zarr.json is not valid zarr metadata ({type(exc).__name__}: {exc})"
            ) from exc
    raise found


@contextlib.contextmanager
def damage_as_store_error(where: object, what: str, fix: str) -> Iterator[None]:
    """Read a stored document (`what`, of the store at `where`) inside this: any way it can
    be damaged is one StoreError naming the store, the document and what to do (`fix`),
    never the JSON parser's or zarr's own error. Absence is the caller's to check first."""
    try:
        yield
    except DAMAGED as exc:
        raise StoreError(
            f"{where}: {what} is damaged ({type(exc).__name__}: {exc}); {fix}"
        ) from exc


@dataclass(frozen=True)
class WriteFault:
    """What an OSError met while writing into a store means to the user, decided once
    (`write_fault`): code: the errno's name (ENOSPC...); cause: the system's words, with the
    path in the way where one is; fix: what to do ("" where nothing can be said); filesystem:
    the file system's fault (full, over quota, read-only: every store on it fails alike, so
    a run stops them all) or the store's own (no permission, a path blocked: the other
    stores go on); state: what the file system is, said of the stores not attempted."""

    code: str
    cause: str
    fix: str
    filesystem: bool
    state: str = ""


AGAIN = "then run the same command"
# errno -> (fix, the file system's, its state)
FAULTS: dict[int, tuple[str, bool, str]] = {
    errno.ENOSPC: (f"free space (or raise the quota), {AGAIN}", True, "full"),
    errno.EDQUOT: (f"raise the quota (or free space), {AGAIN}", True, "over its quota"),
    errno.EFBIG: (
        f"raise the limit on a file's size (ulimit -f) or write on another file system, {AGAIN}",
        True,
        "refusing files this large",
    ),
    errno.EROFS: (
        f"write on a writable file system (or remount this one read-write), {AGAIN}",
        True,
        "read-only",
    ),
    errno.EACCES: (f"give this user write permission there, {AGAIN}", False, ""),
    errno.EPERM: (
        f"give this user write permission there (as root: clear its immutable flag, "
        f"chattr -i), {AGAIN}",
        False,
        "",
    ),
    errno.ENOTDIR: (f"move that file aside, {AGAIN}", False, ""),
    errno.EEXIST: (f"move that file aside, {AGAIN}", False, ""),
    errno.EISDIR: (f"move that folder aside, {AGAIN}", False, ""),
}
FULL = tuple(code for code, (_, filesystem, _) in FAULTS.items() if filesystem)


def write_fault(exc: OSError) -> WriteFault:
    """The one judgement of a write's OSError: its cause, its fix, and whether it is the
    file system's (ENOSPC, EDQUOT, EFBIG, EROFS) or the store's own (EACCES, EPERM, a path
    blocked by a file: ENOTDIR, EEXIST, EISDIR; anything else)."""
    code = exc.errno or 0
    fix, filesystem, state = FAULTS.get(code, ("", False, ""))
    cause = exc.strerror or str(exc)
    path = Path(exc.filename) if exc.filename else None
    if path is not None and code in (errno.ENOTDIR, errno.EEXIST):
        blocker = _file_in_the_way(path)
        cause += f" ({blocker or path} is a file where a folder must be)"
    elif path is not None and code == errno.EISDIR:
        cause += f" ({path} is a folder where a file must be)"
    elif path is not None and code in (errno.EACCES, errno.EPERM):
        cause += f" ({path})"
    return WriteFault(errno.errorcode.get(code, str(code)), cause, fix, filesystem, state)


def fault_named(code: str) -> WriteFault:
    """The fault of an errno named `code` (as a run report records it), its cause the
    system's words alone."""
    number = getattr(errno, code, 0)
    fix, filesystem, state = FAULTS.get(number, ("", False, ""))
    return WriteFault(code, os.strerror(number) if number else code, fix, filesystem, state)


def _file_in_the_way(path: Path) -> Path | None:
    """The first of `path` and the folders above it that exists and is not a folder."""
    for part in (path, *path.parents):
        if part.is_dir():
            return None
        if part.exists() or part.is_symlink():
            return part
    return None


@contextlib.contextmanager
def writing(where: object, what: str) -> Iterator[None]:
    """Write `what` into the store at `where` inside this: an OSError (a full disk, a quota,
    a read-only folder, a file where a folder must be) is one WriteFailed naming the store,
    what was being written, the cause and the fix (`write_fault`), never the bare "No space
    left on device". Writes are whole files renamed into place, so what was written before
    is as it was."""
    try:
        yield
    except OSError as exc:
        fault = write_fault(exc)
        fix = f"{fault.fix}: " if fault.fix else ""
        raise WriteFailed(
            f"{where}: writing {what}: {fault.cause}; {fix}what was written before is kept", fault
        ) from exc


@contextlib.contextmanager
def written_whole(parent: zarr.Group, name: str, where: object, what: str) -> Iterator[None]:
    """Make the group `parent[name]` inside this: on any failure (a full disk, a kill's
    KeyboardInterrupt) what was made of it is removed, so nothing half-made is left to look
    like one, and an OSError is one line (`writing`)."""
    try:
        with writing(where, what):
            yield
    except BaseException:
        with contextlib.suppress(Exception):
            del parent[name]
        raise


def tree_size(path: str | os.PathLike) -> int:
    """Return the bytes of all files below path (os.scandir: a store has many small files)."""
    total = 0
    with os.scandir(path) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                total += tree_size(entry.path)
            elif entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
    return total


def writable(root: Path) -> None:
    """StoreError naming the store where its folder cannot be written (a read-only mount, no
    permission), before anything is: the write's own error named only the file it failed
    on ("zarr.json: Read-only file system"), not the store."""
    if os.access(root, os.W_OK):
        return
    read_only = os.statvfs(root).f_flag & os.ST_RDONLY
    why = "it is on a read-only file system" if read_only else "no permission to write in it"
    raise StoreError(
        f"{root}: cannot write into the store ({why}); nothing was written: run this on a "
        "writable copy of the store"
    )


def open_for_writing(store: Store | str | os.PathLike) -> zarr.Group:
    """A store's root group opened to write derived data into (labels, plans, QC,
    embeddings, the verification record): the one place a store is opened for writing.

    Stores keep no consolidated metadata (ARCHITECTURE.md, "The JPEG codec and consolidated
    metadata"): a copy of every array's metadata in the root goes stale at the first group
    a run adds, and holds every codec, so a reader without one (JPEG) could not open even
    the root. A store made before that carries one loses it here, before anything is added
    beside it."""
    group = zarr.open_group(store, mode="r+", zarr_format=3, use_consolidated=False)
    root = getattr(getattr(group.store, "_store", group.store), "root", None)
    if root is not None:
        writable(Path(root))
        path = Path(root) / "zarr.json"
        doc = json.loads(path.read_bytes())
        if doc.pop("consolidated_metadata", None) is not None:
            write_atomic(path, json.dumps(doc, indent=2).encode())
    return group
