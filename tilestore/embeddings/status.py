"""What a store's embeddings are, read without writing: each group's state, its tiles done
of planned, its slide vectors, and the runs that would finish a cohort.

A group's state, as the writer (`tilestore.embeddings.write`) leaves it:

- complete: every batch written and the group marked so (`EmbeddingWriter.finish`);
- partial: made, not finished, and no live lock: a run was killed, failed or stopped at
  max_tiles; its done batches stay and the same run resumes them (the writer records no
  failure in the store: the run's report says why it stopped);
- running: a live lock beside the store (`write.lock_file`): a run holds it now (its
  heartbeat fresh, `tilestore.locks.gone`; a lock silent longer than `locks.STALE` is a
  dead run's, taken over by the next: the group is then what that run left);
- damaged: what a reader would refuse, as every reader judges it (`groups.check_group`):
  its record or arrays unreadable, its arrays' shapes or dtypes not those it records,
  marked complete with batches not done, or a chunk not the one written at its position
  (moved, swapped, rewritten: NaN written into features since; a shard deleted); of a group
  still being written, the chunks of its done batches. A run refuses it (never skipped as
  complete, never resumed) unless overwrite=True;
- other plan: made from an earlier plan of its name, stored again since (its tiles are
  not the plan's now: a run refuses it unless overwrite=True);
- not started: no group (or one a killed run left before its record: made again);
- blocked: no group, and a file where its folder must be (embeddings/<model>, say): a run
  fails on it until that file is moved aside.

A partial or not-started group whose store cannot be written now (its file system full or
read-only, no permission) says so in its note: a run would fail there (a run stopped by a
write error leaves its group partial, never complete, or none).

Cheap: metadata, the small ``done`` flags, the positions records, shard indexes and the
last 4 bytes of each chunk are read (`tilestore.embeddings.tied`); no pixels, no features
read whole, no lock taken. A group made before positions were recorded says so in its note
("not tied").
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Annotated, Any

import zarr
from zarr.abc.store import Store

from tilestore import locks
from tilestore.embeddings.groups import (
    check_group,
    embed_again,
    list_embeddings,
    open_group,
    plan_groups,
    plan_replaced,
    slide_name,
)
from tilestore.embeddings.layout import group_name, model_folder
from tilestore.embeddings.recipe import scale_of
from tilestore.embeddings.slides import SLIDES, VECTOR, guide_current
from tilestore.embeddings.tied import tied_arrays
from tilestore.embeddings.write import lock_file
from tilestore.errors import OptionError, StoreError
from tilestore.format.records import (
    EmbeddingsRecord,
    SlideVectorRecord,
    read_record,
    written_record,
)
from tilestore.format.store import damage_as_store_error, is_store
from tilestore.format.store import open_group as open_store_group
from tilestore.options import Opt
from tilestore.sources.remote import url_store
from tilestore.urls import is_url, named

# What a cohort's status is asked of (`tilestore status`'s flags): the model, the plan, a
# slide encoder whose vectors must be there too
AskedModel = Annotated[
    str | None,
    Opt("The model whose embeddings are asked for.", none="the stores' only one"),
]
AskedPlan = Annotated[
    str | None,
    Opt("The plan they must be of.", none="whichever each was made from"),
]
AskedEncoder = Annotated[str | None, Opt("Also a slide vector of this encoder in each store.")]

STATES = ("complete", "partial", "running", "damaged", "other plan", "not started", "blocked")
# a run cannot finish these without overwrite=True (blocked: a file moved aside)
TROUBLE = ("damaged", "other plan", "blocked")
FULL_BELOW = 2**20  # bytes free under which a store's file system is said full
WAITING = ("partial", "not started")  # a run finishes these
# what becomes of a running group's lock whose job died, unasked (`locks.gone`)
TAKEN_OVER = (
    "a dead job's lock is taken over by the next run once its heartbeat has stopped for "
    f"{locks.span(locks.STALE)}"
)
UNTIED = (
    "not tied to its chunks' positions (made before they were recorded: a swapped or moved "
    "chunk goes unseen; overwrite=True makes it again with them)"
)


@dataclass(frozen=True)
class Lock:
    """The live lock of a run writing the group: where it runs and since when (age: seconds,
    None where its time cannot be read), its last heartbeat (beat_s: seconds since it; None:
    a lock of a version before heartbeats) and the lock file's path."""

    host: str | None
    pid: int | None
    since: str | None
    age_s: float | None
    path: str = ""
    beat_s: float | None = None


@dataclass(frozen=True)
class SlideVector:
    """A slide embedding under the group (``slides/<encoder>``): its encoder, width, and
    whether it was computed from the tile features the group holds now (current), from
    ones replaced since (stale), or cannot be read (damaged)."""

    encoder: str
    dim: int | None
    state: str


@dataclass(frozen=True)
class GroupStatus:
    """One model's embeddings group in a store, as `STATES` says (see the module).

    tiles: the plan's tiles (0 where there is no group); tiles_done: those in done batches;
    run: what a run must repeat to resume the group, as `embed`'s parameters (batch_size,
    dtype, precision, compile, channels, tokens, quality; {} where there is no group);
    tile, mpp: the side in px of the group's tiles and the um/px they were read at (None:
    level-0 pixels of a slide without a pixel size), where its record says (tile None where
    it does not): what tells whether they are the model's input, which a resume of tiles
    that are not must allow again (any_scale);
    tied: whether its chunks are tied to their positions (False: a group made before they
    were recorded, read and checked as before; None: not read, or no group);
    note: what to do or what was found, one line."""

    model: str
    path: str
    state: str
    plan: str | None = None
    tiles: int = 0
    tiles_done: int = 0
    batches: int = 0
    batches_done: int = 0
    dtype: str | None = None
    dim: int | None = None
    started: str | None = None
    finished: str | None = None
    lock: Lock | None = None
    slide_vectors: tuple[SlideVector, ...] = ()
    run: dict[str, Any] | None = None
    tile: int | None = None
    mpp: float | None = None
    tied: bool | None = None
    note: str = ""

    def has_vector(self, encoder: str) -> bool:
        """Whether a current slide vector of `encoder` is stored."""
        return any(
            v.state == "current" and _stored_name(v.encoder) == _stored_name(encoder)
            for v in self.slide_vectors
        )

    def left(self, slide_encoder: str | None = None) -> bool:
        """Whether a run has work here: tiles to embed, or (with a slide encoder) a complete
        group without that encoder's current vector."""
        if self.state in WAITING:
            return True
        return (
            self.state == "complete"
            and slide_encoder is not None
            and (not self.has_vector(slide_encoder))
        )

    @property
    def blocked(self) -> bool:
        """Whether a run is refused here without overwrite=True (damaged, other plan)."""
        return self.state in TROUBLE

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class StoreStatus:
    """A store's embeddings groups (every one, or the one asked for)."""

    store: str
    name: str
    groups: tuple[GroupStatus, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "store": self.store,
            "name": self.name,
            "groups": [g.to_json() for g in self.groups],
        }


def embeddings_status(
    store: str | os.PathLike, model: str | None = None, plan: str | None = None
) -> StoreStatus:
    """Return what the store's embeddings are, writing nothing and taking no lock.

    model: the groups of this model only (state "not started" where there is none); None:
    every group the store holds. plan: the group of this plan only ("not started" where the
    model has none of it: other plans' groups live beside it). A group made from an earlier
    plan of its name, stored again since, is "other plan" whether a plan is named or not:
    its plan's recorded uid is compared with the stored plan's, as the writer judges.
    StoreError where `store` is not a tilestore store."""
    # a store in a bucket: read through zarr's FsspecStore (no lock nor file system to say)
    where = url_store(str(store)) if is_url(store) else Path(store)
    if isinstance(where, Path) and not is_store(where):
        raise StoreError(
            f"{store}: not a store (no zarr.json); give stores made by `tilestore convert`"
        )
    open_store_group(where, complete=False)  # ours, its record readable
    models = list_embeddings(where) if model is None else [model]
    found = [(name, path) for name in models for path in _paths(where, name, plan, model)]
    groups = tuple(_group_status(where, path, name, plan) for name, path in found)
    return StoreStatus(named(store), slide_name(where), groups)


def _paths(store, model: str, plan: str | None, asked: str | None) -> list[str]:
    """The paths of a model's groups to say (of `plan` only, where named): a model asked
    for that has none, its folder (said "not started"); a folder whose listing is damaged,
    itself (said "damaged")."""
    try:
        groups = plan_groups(store, model)
    except StoreError:
        return [model_folder(model)]
    if plan is not None:
        groups = {p: path for p, path in groups.items() if p == plan}
        if asked is not None and not groups:
            return [group_name(model, plan)]
    if asked is not None and not groups:
        return [model_folder(model)]
    return list(groups.values())


def _group_status(store: Path | Store, path: str, model: str, plan: str | None) -> GroupStatus:
    found = _group_found(store, path, model, plan)
    if found.state not in WAITING or not isinstance(store, Path):
        return found
    why = _unwritable(store)
    return replace(found, note=f"{found.note}; but {why}") if why else found


def _group_found(store: Path | Store, path: str, model: str, plan: str | None) -> GroupStatus:
    name = model
    lock = _live_lock(store, path) if isinstance(store, Path) else None
    try:
        group = open_group(store, path)
    except KeyError:
        if lock is not None:
            return GroupStatus(name, path, "running", lock=lock, note=_running(lock))
        blocker = _in_the_way(store, path) if isinstance(store, Path) else None
        if blocker is not None:
            note = (
                f"{blocker} is a file where a folder must be: a run cannot make {path}; move "
                "that file aside, then run embed again"
            )
            return GroupStatus(name, path, "blocked", note=note)
        return GroupStatus(name, path, "not started", run={}, note=f"no {path}")
    except StoreError as exc:
        return GroupStatus(name, path, "damaged", note=str(exc))
    try:
        with damage_as_store_error(store, path, embed_again(path)):
            return _read_group(store, path, name, group, plan, lock)
    except StoreError as exc:  # DamagedEmbeddings among them
        return GroupStatus(name, path, "damaged", lock=lock, note=str(exc))


def _in_the_way(store: Path, path: str) -> Path | None:
    """The file (not a folder) where a folder of the group's path must be, if any."""
    at = Path(store)
    for part in path.split("/"):
        at = at / part
        if not at.exists() and not at.is_symlink():
            return None
        if not at.is_dir():
            return at
    return None


def _unwritable(store: Path) -> str:
    """Why a run could not write into the store now ("" where it could): its file system
    read-only or full (under `FULL_BELOW` free), or no permission to write in it."""
    try:
        found = os.statvfs(store)
    except OSError:
        return ""
    if found.f_flag & os.ST_RDONLY:
        return "its file system is read-only: a run cannot write there"
    free = found.f_bavail * found.f_frsize
    if free < FULL_BELOW:
        return f"its file system is full ({free // 1024} KB free): free space before a run"
    if not os.access(store, os.W_OK):
        return "no permission to write into it (or it is immutable: chattr -i)"
    return ""


def _read_group(
    store: Path, path: str, name: str, group: zarr.Group, plan: str | None, lock: Lock | None
) -> GroupStatus:
    record = written_record(group, EmbeddingsRecord, f"{store}: {path}", embed_again(path))
    arrays = dict(group.arrays())
    if record is None or "done" not in arrays:  # killed while made: made again
        state = "running" if lock else "not started"
        note = _running(lock) if lock else f"{path} was left half made by a killed run"
        return GroupStatus(name, path, state, lock=lock, run={}, note=note)
    meta = record.to_attrs()
    name = record.model_name or name
    flags = check_group(store, path, meta, arrays)  # as every reader judges it: else damaged
    tiles = arrays["features"].shape[0] if record.tiles is None else record.tiles
    batch = int(record.batch_size)  # type: ignore[arg-type]  (None: damaged, said)
    batches, done = len(flags), int((flags == 1).sum())
    tiles_done = done * batch - (batch * batches - tiles if batches and flags[-1] == 1 else 0)
    scale = scale_of(meta)
    common = {
        "plan": record.plan_name,
        "tiles": tiles,
        "tiles_done": tiles_done,
        "batches": batches,
        "batches_done": done,
        "dtype": str(arrays["features"].dtype),
        "dim": int(arrays["features"].shape[1]),
        "started": meta.get("started"),
        "finished": meta.get("finished"),  # None until finished (record.finished: "")
        "lock": lock,
        "slide_vectors": _slide_vectors(store, path, group, record),
        "run": resume_options(meta),
        "tile": scale.tile if scale else None,
        "mpp": scale.mpp if scale else None,
        "tied": tied_arrays(meta) is not None,
    }
    if lock is not None:
        return GroupStatus(name, path, "running", **common, note=_running(lock))
    other = _other_plan(store, record)
    if other:
        return GroupStatus(name, path, "other plan", **common, note=other)
    untied = "" if common["tied"] else f"; {UNTIED}"
    if record.complete:
        return GroupStatus(name, path, "complete", **common, note=untied[2:])
    note = f"{done} of {batches} batches done: the same run resumes it{untied}"
    return GroupStatus(name, path, "partial", **common, note=note)


def resume_options(meta: dict[str, Any]) -> dict[str, Any]:
    """What a run must repeat to resume a group (its record: `RunIdentity.record`), as
    `embed`'s parameters: batch_size, dtype, precision, compile, and channels, tokens
    (the grid's side) and quality where the group has them."""
    options: dict[str, Any] = {k: meta[k] for k in ("batch_size", "dtype") if k in meta}
    if meta.get("precision") in ("bf16", "fp32"):  # "given": features written by another tool
        options["precision"] = meta["precision"]
    if meta.get("compile"):
        options["compile"] = True
    if meta.get("channels"):
        options["channels"] = tuple(meta["channels"])
    if meta.get("tokens"):
        options["tokens"] = int(meta["tokens"]["grid"][0])
    if meta.get("quality"):
        options["quality"] = True
    return options


def _other_plan(store: Path, record: EmbeddingsRecord) -> str:
    """Why a group no longer stands for its plan ("" where it does): `plan_replaced`, the
    readers' own judgement."""
    replaced = plan_replaced(store, record)
    if not replaced:
        return ""
    said = replaced.removeprefix("was ")
    return f"{said}; pass overwrite=True to embed the plan stored now"


def _guide_same(store: Path, record: SlideVectorRecord, folder: str) -> bool:
    """Whether the tile group that guided a vector (EAGLE's) is the one there now, as the
    reader judges it (`guide_current`); a vector no guide made is."""
    if not record.guide:
        return True
    try:
        guide_current(store, record.guide, folder, record.encoder or folder)
    except StoreError:
        return False
    return True


def _slide_vectors(
    store: Path, path: str, group: zarr.Group, meta: EmbeddingsRecord
) -> tuple[SlideVector, ...]:
    """The group's slide vectors, their records and array shapes read (not their values)."""
    try:
        slides = group[SLIDES]
    except KeyError:
        return ()
    found = []
    for folder, vector in sorted(slides.groups()):
        if folder.startswith("."):  # a killed write's leftover, never read
            continue
        try:
            with damage_as_store_error(store, f"{path}/{SLIDES}/{folder}", "compute it again"):
                where = f"{store}: {path}/{SLIDES}/{folder}"
                record = read_record(vector, SlideVectorRecord, where)
                if record is None:
                    raise KeyError("its record")
                dim = int(record.dim)  # type: ignore[arg-type]  (None: damaged, said)
                shape = vector[VECTOR].shape
                made_from = str(record.tiles["finished"])
        except StoreError:
            found.append(SlideVector(folder, None, "damaged"))
            continue
        current = made_from == meta.finished and _guide_same(store, record, folder)
        state = "damaged" if shape != (dim,) else "current" if current else "stale"
        found.append(SlideVector(record.encoder or folder, dim, state))
    return tuple(found)


def _live_lock(store: Path, path: str) -> Lock | None:
    """The lock of a run writing the group now; None where there is none or its holder is
    gone (`locks.gone`: the next run takes such a lock over)."""
    lock = lock_file(Path(os.path.abspath(store)), path)
    if not lock.exists():
        return None
    holder = locks.read(lock)
    now = time.time()
    if holder is None or locks.gone(holder, now):  # released meanwhile, or its holder gone
        return None
    beat = holder.silent(now) if holder.beat is not None else None
    return Lock(holder.host, holder.pid, holder.since, holder.age(now), str(lock), beat)


def _running(lock: Lock) -> str:
    age = f" for {locks.span(lock.age_s)}" if lock.age_s is not None else ""
    beat = f", its last heartbeat {locks.span(lock.beat_s)} ago" if lock.beat_s is not None else ""
    return f"written by pid {lock.pid} on {lock.host}{age}{beat}; its lock: {lock.path}"


def _stored_name(name: str) -> str:
    return name.replace(":", "-").replace("/", "_")


@dataclass(frozen=True)
class Finish:
    """One `embed` run that finishes part of a cohort: the stores (as given) and its
    options as `embed`'s parameters (model, plan, slide_encoder and what a resume repeats)."""

    stores: tuple[str, ...]
    options: dict[str, Any]


# (a store as given, the status of its group of the model asked about), for a cohort's stores
Found = Sequence[tuple[str, GroupStatus]]


def finishing_runs(
    found: Found, model: str, plan: str | None = None, slide_encoder: str | None = None
) -> list[Finish]:
    """The `embed` runs that finish a cohort's stores left (`GroupStatus.left`), each
    (store, its group's status) in `found`: a partial group with the options it was made
    with (its plan among them: a resume must repeat them, else it is refused); a group not
    started with those the cohort's other groups agree on (batch size aside), and their
    plan where they agree on one and the store holds a plan of that name (`plan` given:
    that one), so the cohort stays one recipe to read (`tilestore.embeddings.recipe`); runs
    of equal options merged, in the order of the stores. Running, damaged and other-plan
    groups are left out: a run would be refused on them. With a slide encoder no plan is
    named: the encoder plans the tiles it reads."""
    left = [(store, status) for store, status in found if status.left(slide_encoder)]
    return _merged(found, left, model, plan, slide_encoder)


def breaking_runs(
    found: Found, model: str, plan: str | None = None, slide_encoder: str | None = None
) -> list[Finish]:
    """The `embed` runs that take over the locks of the cohort's running groups and finish
    them, for a job known to be dead (break_lock=True; without it the lock is taken over
    once silent for `locks.STALE`): each with the options `finishing_runs` would give it,
    as partial where the group has its record, else as not started."""
    running = [
        (store, replace(status, state="partial" if status.run else "not started"))
        for store, status in found
        if status.state == "running"
    ]
    return _merged(found, running, model, plan, slide_encoder, break_lock=True)


def _merged(
    found: Found, todo: Found, model: str, plan: str | None, slide_encoder: str | None, **more: Any
) -> list[Finish]:
    """One run per store of `todo` ((store, its status as the run finds it)) with the
    options `_finishing` gives it and `more`, runs of equal options merged in the order of
    the stores; what the cohort's made groups agree on is read from all of `found`."""
    made = [g for _, g in found if g.state in ("complete", "partial")]
    shared = _shared(g.run for g in made)
    planned = {g.plan for g in made}
    runs: dict[tuple, list[str]] = {}
    for store, status in todo:
        options = _finishing(store, status, model, plan, slide_encoder, shared, planned)
        runs.setdefault(tuple({**options, **more}.items()), []).append(store)
    return [Finish(tuple(stores), dict(key)) for key, stores in runs.items()]


def _finishing(store, status, model, plan, slide_encoder, shared, planned) -> dict[str, Any]:
    """The options of the run that finishes one store's group (`finishing_runs`)."""
    options: dict[str, Any] = {"model": model}
    if status.state == "partial":
        options.update(status.run or {}, plan=status.plan)
    elif status.state == "not started":
        options.update(shared)
        if plan:
            options["plan"] = plan
        elif len(planned) == 1 and _holds_plan(store, next(iter(planned))):
            options["plan"] = next(iter(planned))  # else the run's own plan is made
    if slide_encoder:
        options.pop("plan", None)
        options["slide_encoder"] = slide_encoder
    return options


def _holds_plan(store: str, name: str | None) -> bool:
    """Whether the store holds a plan of this name (a run given it reads it; without it, a
    store of several plans or none has one made: not the cohort's)."""
    if not name:
        return False
    try:
        open_group(store, f"plans/{name}")
    except (KeyError, StoreError):
        return False
    return True


def _shared(runs) -> dict[str, Any]:
    """The options every run agrees on, batch size aside ({} where none was made or they
    differ: a new group then takes the run's defaults)."""
    made = [{k: v for k, v in (run or {}).items() if k != "batch_size"} for run in runs]
    if not made or any(m != made[0] for m in made):
        return {}
    return made[0]


def only_model(found: Sequence[StoreStatus]) -> str | None:
    """The one model whose embeddings groups a cohort's stores hold (a store holding none
    is one not started; one holding several plans' groups of it counts once); None where no
    store holds any. OptionError naming the models found (and how many stores hold each)
    where there are several."""
    held: dict[str, int] = {}
    for status in found:
        for model in {group.model for group in status.groups}:
            held[model] = held.get(model, 0) + 1
    if len(held) <= 1:
        return next(iter(held), None)
    bare = sum(1 for s in found if not s.groups)
    models = ", ".join(f"{m} ({n} store{'s' * (n != 1)})" for m, n in sorted(held.items()))
    without = f"; {bare} of {len(found)} stores hold none" if bare else ""
    raise OptionError(
        f"which model? embeddings found: {models}{without}; name one with model=<name>"
    )
