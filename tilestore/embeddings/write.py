"""Writing embeddings into a store as embeddings/<model>/<plan>, resumable batch by batch.

The group (`tilestore.embeddings.layout`) is made with every coordinate of the plan and an
empty features array in shards of whole batches. A batch's features wait in memory until
every batch of their shard still to do is in (or the run ends); then the shard is written
whole and renamed into place (zarr's local store writes each file so), and only then are its
batches' ``done`` flags written: a batch is done only when its shard is durable, so a run
killed at any point resumes, batch by batch, where its last shard left it. A hidden lock file
beside the store keeps two processes from embedding one store with one model at the same
time; a Dask cohort gives each worker whole shards (`tilestore.embed.cohort`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import Crc32cCodec
from zarr.core.sync import sync

from tilestore import locks
from tilestore.embeddings import tied
from tilestore.embeddings.groups import check_group, non_finite_rows
from tilestore.embeddings.layout import COORDINATES, UNITS, group_name, model_folder
from tilestore.embeddings.recipe import scale_of, weights_unknown
from tilestore.errors import AlreadyComplete, EmbeddingError, StoreError, TilestoreWarning
from tilestore.format.codecs import zstd_codecs
from tilestore.format.leftovers import clear_unfinished_files
from tilestore.format.made import made_new
from tilestore.format.records import (
    EmbeddingsRecord,
    find_record,
    holds_record,
    read_record,
    write_record,
    written_record,
)
from tilestore.format.shards import SHARD_TILES, batches_per_shard, column, sharded
from tilestore.format.store import software_versions, writing, written_whole
from tilestore.plan.grid import TilePlan
from tilestore.reading.slide import Slide

# With tokens: the most bytes of rows a writer keeps waiting for their shard (the shard is
# made smaller to fit), and the bytes of the tokens' inner chunks (a tile's grid is read
# from one chunk of about this size, not a whole batch's).
TOKENS_WAITING = 512 * 2**20
QUALITY_TOLERANCE = 0.1  # a plan's um/px this near the run's: its tiles measured as they are
TOKENS_CHUNK = 4 * 2**20
AGAIN = "pass overwrite=True to embed again"  # what to do about a damaged group


@dataclass(frozen=True)
class RunIdentity:
    """What an embeddings group records of the run that writes it, decided once by the
    engine (`Embedder.writer_identity`): a run resumes a group only where these are equal.

    model: the model's description (`LoadedModel.describe`: name, weights, output_dim...),
    with the weights' identity: the sha256 of the weights loaded, for random weights
    (``random:``) the seed they were drawn with and the sha256 of the draw; a group whose
    weights are not known (random, no seed: `recipe.weights_unknown`) is never resumed.
    channels: a multiplex store's channels read as R, G, B (None for RGB stores).
    shard_tiles: tiles per features shard of a group this run makes (None: `SHARD_TILES`;
    a group made before keeps its own shards; not compared on resume).
    tokens: the patch-token grid stored beside the features (grid, dim, model_grid,
    pooling: `tilestore.embed.forward.TokenLayout.record`); None: features only.
    quality: the per-tile quality measures stored beside them (measures, the um/px their
    scales were taken at, their parameters: `tilestore.qc.tilewise`); None: none. Each row
    a run writes is the features, then the token grid, then the measures."""

    model: dict[str, Any]
    batch_size: int
    dtype: str
    precision: str
    compile: bool
    channels: tuple[str, ...] | None = None
    shard_tiles: int | None = None
    tokens: dict[str, Any] | None = None
    quality: dict[str, Any] | None = None

    def record(self) -> dict[str, Any]:
        """The group's attributes for it (the keys stores have always had)."""
        return {
            "model": self.model,
            "batch_size": self.batch_size,
            "dtype": self.dtype,
            "precision": self.precision,
            "compile": self.compile,
            **({"channels": list(self.channels)} if self.channels else {}),
            **({"tokens": self.tokens} if self.tokens else {}),
            **({"quality": self.quality} if self.quality else {}),
        }


@dataclass(frozen=True)
class ResumeState:
    """What a store's embeddings group of a model holds for a plan, read without writing:
    the one answer the writer, the dry run and the checks before a run agree on.

    state: "new" (no group), "complete" (skipped unless overwrite), "resumes" (batches
    done), "other plan" (made from another plan: refused unless overwrite), "damaged" (not
    what its runs wrote: refused unless overwrite, which makes it again); done: batches
    done; tiles: the group's tiles; why: the refusal or the note, as the writer says it."""

    state: str
    done: np.ndarray  # indices of the batches done
    batch_size: int
    tiles: int
    why: str = ""


# What a group records of its run that decides what its features are of, not only how
# precisely they were computed: the channels read as R, G, B. A complete group made
# otherwise is never skipped as this run's (`resume_state`); one of another dtype or precision
# is (the same tiles, the same model: its features stand, made as its record says).
RESULT_KEYS = ("channels",)


def group_path(slide: Slide, model: str, plan_name: str) -> str:
    """Where `model`'s group of plan `plan_name` is, or is made: embeddings/<model>/<plan>;
    in a store made before, embeddings/<model> itself where its record names that plan (it
    is resumed where it is, never moved)."""
    folder = model_folder(model)
    try:
        record = find_record(slide.group[folder], EmbeddingsRecord)
    except (KeyError, ValueError, TypeError, zarr.errors.BaseZarrError):
        record = None  # none there (a damaged one is said by `resume_state`, at the plan's path)
    if record is not None and record.plan_name == plan_name:
        return folder
    return group_name(model, plan_name)


def resume_state(
    slide: Slide,
    model: str,
    plan_name: str,
    plan_uid: str | None,
    plan_tiles: int | None,
    asked: dict[str, Any] | None = None,
) -> ResumeState:
    """Whether and where a run resumes `model`'s group of plan `plan_name` in the store
    (plan_uid None: a plan not stored yet, whose name alone is compared; plan_tiles None:
    not known yet).
    Another plan's group of the model is no concern: they live side by side. "damaged"
    where a reader would refuse the group, or (a group still being written) its done
    batches: `groups.check_group`, as `status` judges it (a run refuses it unless
    overwrite=True: never skipped as complete, never resumed). asked: what the run records
    that decides what its features are of (`RESULT_KEYS`: the channels), as the group's
    record says them: a complete group made otherwise is "other settings", never skipped as
    complete (its features are not this run's: other channels read as R, G, B)."""
    path = group_path(slide, model, plan_name)
    try:
        group = slide.group[path]
        record = written_record(group, EmbeddingsRecord, f"{slide.name}: {path}", AGAIN)
        if record is None or "done" not in group:
            return ResumeState("new", np.empty(0, np.int64), 0, 0)
        arrays = dict(group.arrays())
    except KeyError:
        return ResumeState("new", np.empty(0, np.int64), 0, 0)
    except StoreError as exc:  # its record damaged (DamagedEmbeddings, naming the key)
        return ResumeState("damaged", np.empty(0, np.int64), 0, 0, str(exc))
    except (ValueError, TypeError, zarr.errors.BaseZarrError) as exc:
        why = f"{slide.name}: {path} is damaged ({type(exc).__name__}: {exc}); {AGAIN}"
        return ResumeState("damaged", np.empty(0, np.int64), 0, 0, why)
    try:
        flags = check_group(slide.name, path, record.to_attrs(), arrays, AGAIN)
    except StoreError as exc:  # DamagedEmbeddings, a ChunkError of a damaged shard
        return ResumeState("damaged", np.empty(0, np.int64), 0, 0, str(exc))
    except (ValueError, TypeError, zarr.errors.BaseZarrError) as exc:
        why = f"{slide.name}: {path} is damaged ({type(exc).__name__}: {exc}); {AGAIN}"
        return ResumeState("damaged", np.empty(0, np.int64), 0, 0, why)
    tiles = int(arrays["features"].shape[0])
    done, batch = np.flatnonzero(flags == 1), record.batch_size or 1
    made = record.plan_name
    same = made == plan_name and (plan_uid is None or record.plan_uid == plan_uid)
    if not same:
        # each number next to what it counts: the group's tiles are those of the plan it was
        # made from, which a plan of the same name made again no longer is
        again = made == plan_name
        then = " as it was before it was made again" if again else ""
        now = "to be made by the run" if plan_tiles is None else f"{plan_tiles} tiles"
        why = (
            f"{slide.name}: {path} was made from plan {made!r}{then} ({tiles} "
            f"tiles embedded), not this run's {plan_name!r} ({now}"
            + ("; a plan of the same name made again counts as another" if again else "")
            + "); pass overwrite=True to replace it"
        )
        return ResumeState("other plan", done, batch, tiles, why)
    differ = [
        f"{key}: {record.get(key)!r}, this run {value!r}"
        for key, value in (asked or {}).items()
        if key in RESULT_KEYS and record.get(key) != value
    ]
    if record.complete and differ:
        why = (
            f"{slide.name}: {path} is complete but was made otherwise ({'; '.join(differ)}): "
            "its features are not this run's; pass overwrite=True to embed it again so"
        )
        return ResumeState("other settings", done, batch, tiles, why)
    if record.complete:
        why = (
            f"{slide.name}: {path} is already complete ({tiles} tiles); pass overwrite=True "
            "to recompute"
        )
        return ResumeState("complete", done, batch, tiles, why)
    why = f"resumes: {len(done)} batches done" if len(done) else ""
    return ResumeState("resumes", done, batch, tiles, why)


class EmbeddingWriter:
    """Creates or resumes embeddings/<model> for one slide and plan, and writes batches."""

    def __init__(
        self,
        slide: Slide,
        plan: TilePlan,
        plan_uid: str,
        identity: RunIdentity,
        *,
        overwrite: bool = False,
        create: bool = True,
        break_lock: bool = False,
        lock_for: int | None = None,
    ) -> None:
        """Check the store's group against this run and take the lock (break_lock: take
        over whatever lock is there, `_take_lock`; lock_for: the pid of the run this process
        writes for, a store process's caller: the lock is gone with it too, `locks.gone`).

        create=False leaves making (or, with overwrite, remaking) the group to `create()`,
        so a run can start reading tiles first; until then every batch is to do.
        """
        self._setup(slide, plan, plan_uid, identity)
        store = _directory(slide)
        self.lock_path = lock_file(store, self.path)
        # The lock first, then the group: another run may be making it right now.
        with writing(slide.name, f"its lock {self.lock_path}"):
            self._take_lock(break_lock, lock_for)
        try:
            if (store / self.path).is_dir():  # a killed run's files, never renamed
                with writing(slide.name, self.path):
                    clear_unfinished_files(store / self.path)
            # overwrite: whatever is there is replaced (a damaged group too), once made anew
            existing = self._existing() if not overwrite else None
            if existing is not None:
                asked = {key: self.identity.get(key) for key in RESULT_KEYS}
                found = resume_state(
                    slide, identity.model["name"], plan.name, plan_uid, len(plan), asked
                )
                if found.state in ("other plan", "damaged", "other settings"):
                    raise EmbeddingError(found.why)
                if found.state == "complete":
                    raise AlreadyComplete(found.why)
                self._refuse_unknown_weights(existing)
                if not self._compatible(existing):
                    raise EmbeddingError(self._mismatch(existing))
                self._open(existing)
            self._replace = overwrite and (store / self.path).exists()
            if create:
                self.create()
        except BaseException:
            self._release_lock()
            raise

    def create(self, maker: Callable[..., Any] | None = None) -> None:
        """Make the group (replacing an old one under overwrite=True), unless it is open.
        Where it cannot be made (WriteFailed: a full disk, a file in the way), what was made
        of it is removed, and the writer writes nothing (`_made_group`).

        maker: called as maker(make_group, store, plan, plan_uid, identity) to make it
        elsewhere, and wait for it (a run hands it to a process: making a group is some 30
        zarr arrays, 200 ms of one CPU that a thread of the run would hold the GIL for); this
        writer holds the lock meanwhile, and opens the group made."""
        if self.group is None:
            with written_whole(self.root, self.path, self.slide.name, self.path):
                if self._replace:
                    _removed(self.root, self.path)
                if maker is None:
                    self._open(*self._create())
                else:
                    store = str(_directory(self.slide))
                    maker(make_group, store, self.plan, self._uid, self.run)
                    self._open(self.root[self.path])
            self._made = True

    def _made_group(self) -> None:
        """EmbeddingError where the group is not open (its making failed, or was never
        asked): a writer is not used past a failed `create`."""
        if self.group is None:
            raise EmbeddingError(
                f"{self.slide.name}: {self.path} was not made (its making failed): nothing "
                "can be written into it"
            )

    def _open(self, group, made: tuple[dict, dict] | None = None) -> None:
        """Open the group to write; made: its arrays and their positions' records as this
        writer just made them (`_create`), taken as they are: none written yet."""
        arrays = made[0] if made is not None else group
        self.group, self.features, self._done = group, arrays["features"], arrays["done"]
        self.tokens = arrays["tokens"] if self.run.tokens else None
        self.quality = arrays["quality"] if self.run.quality else None
        shards = self.features.shards  # None: a group made before shards, a file per batch
        self.per_shard = shards[0] // self.batch_size if shards else 1
        # the chunks' positions, recorded as shards are written (None: a group made before)
        tying = made is not None or tied.tied_arrays(self._record(group).to_attrs()) is not None
        where = f"{self.slide.name}: {self.path}"
        self.positions = tied.Recorder(group, where, AGAIN, made) if tying else None
        # done on disk, as this writer knows it
        self._stored = np.zeros(self.blocks, bool) if made else self._done[:].astype(bool)
        self._summary: dict[str, Any] | None = None  # the measures' summary, until a write

    @classmethod
    def attach(
        cls, slide: Slide, plan: TilePlan, plan_uid: str, identity: RunIdentity
    ) -> EmbeddingWriter:
        """Open an existing group to write some of its batches (a slice, on a Dask worker).

        Takes no lock and never marks the group complete: whoever made the group (the
        cohort coordinator) holds the lock and finishes it when every slice is done.
        """
        self = cls.__new__(cls)
        self._setup(slide, plan, plan_uid, identity)
        self.attached = True
        group = self._existing()
        if group is None:
            raise EmbeddingError(f"{slide.name}: no {self.path} to write a slice into")
        self._refuse_unknown_weights(group)
        if not self._compatible(group):
            raise EmbeddingError(self._mismatch(group))
        self._open(group)
        return self

    def _setup(self, slide, plan, plan_uid, identity: RunIdentity) -> None:
        self.slide, self.plan, self.batch_size = slide, plan, identity.batch_size
        self.path = group_path(slide, identity.model["name"], plan.name)
        self.root = slide.writable_group()
        self.run = identity
        # what the group's attributes must equal for this run to resume it
        self.identity = {**identity.record(), "plan": {"name": plan.name, "uid": plan_uid}}
        self._uid = plan_uid
        self._lock = None
        self.attached = False
        self.group = None
        self._made = False  # this writer made the group (so may remove it unused)
        self._pending: dict[int, np.ndarray] = {}  # batches waiting for their shard
        self.blocks = -(-len(plan) // identity.batch_size)
        self.quality_note = _quality_scale(plan, identity.quality)

    # -- state --------------------------------------------------------------------------

    def todo(self) -> np.ndarray:
        """Indices of batches not yet written."""
        if self.group is None:  # made afresh when the run gets to it
            return np.arange(self.blocks)
        return np.flatnonzero(self._done[:] == 0)

    def tiles_done(self) -> int:
        """The tiles of the batches done on disk, as this writer knows them (a run's and
        those before it): what an interrupted run keeps of the store."""
        if self.group is None:
            return 0
        done = np.flatnonzero(self._stored)
        return int(np.minimum(self.batch_size, len(self.plan) - done * self.batch_size).sum())

    def write(self, block: int, features: np.ndarray) -> None:
        """Take one batch's features (copied: the caller's buffer is reused); once every
        batch of its shard still to do is in, write the shard, then mark them done. With
        tokens, each row is the features then the tile's token grid, flattened."""
        self._made_group()
        self._pending[block] = np.array(features, copy=True)
        shard = block // self.per_shard
        first, last = self._shard(shard)
        if all(self._stored[b] or b in self._pending for b in range(first, last)):
            with writing(self.slide.name, f"{self.path} (its shard {shard})"):
                self._flush(shard)

    def flush(self) -> None:
        """Write every shard with batches waiting (a run's end, a trial's last shard)."""
        for shard in sorted({b // self.per_shard for b in self._pending}):
            with writing(self.slide.name, f"{self.path} (its shard {shard})"):
                self._flush(shard)

    def _shard(self, shard: int) -> tuple[int, int]:
        """The batches [first, last) of a shard."""
        return shard * self.per_shard, min((shard + 1) * self.per_shard, self.blocks)

    def _flush(self, shard: int) -> None:
        """Write a shard's waiting batches in one write of the whole shard (a shard with done
        batches is read back first: zstd is lossless, so their values are rewritten bit for
        bit), then their done flags: a kill in between leaves features whose batches are not
        done, redone."""
        first, last = self._shard(shard)
        blocks = [b for b in range(first, last) if b in self._pending]
        if not blocks:
            return
        self._check_lock()
        n, batch = self.features.shape[0], self.batch_size
        lo, hi = first * batch, min(last * batch, n)
        if len(blocks) == last - first:  # the whole shard: nothing to read back
            region = np.empty((hi - lo, self.features.shape[1]), self.features.dtype)
        else:
            region = self.features[lo:hi]
        dim = self.features.shape[1]
        for b in blocks:
            start = b * batch - lo
            features = self._pending[b][:, :dim]
            region[start : start + len(features)] = features
        # the same tiles' token grids and measures, written before the features
        whole, at = len(blocks) == last - first, dim
        for part in (self.tokens, self.quality):
            if part is not None:
                nan = part is self.quality and self.quality_note is not None
                at = self._flush_part(part, at, blocks, lo, hi, whole, nan=nan)
        self.features[lo:hi] = region
        self._summary = None
        flags = self._stored[first:last].copy()
        flags[np.asarray(blocks) - first] = True
        if self.positions is not None:  # read back as written; the flags' before the flags
            self.positions.shard(shard, first, flags.astype(np.uint8))
        self._done[first:last] = flags.astype(np.uint8)
        self._stored[first:last] = flags
        for b in blocks:
            del self._pending[b]

    def _flush_part(
        self, array, at: int, blocks, lo: int, hi: int, whole: bool, nan: bool = False
    ) -> int:
        """Write the rows' columns from `at` on that `array` holds (a tile's token grid, its
        measures) for these batches (NaN where `nan`: not judged); return where the next
        part's columns start."""
        shape, batch = array.shape, self.batch_size
        width = int(np.prod(shape[1:]))
        region = np.empty((hi - lo, *shape[1:]), array.dtype) if whole else array[lo:hi]
        for b in blocks:
            start = b * batch - lo
            values = self._pending[b][:, at : at + width]
            region[start : start + len(values)] = (
                np.nan if nan else values.reshape(len(values), *shape[1:])
            )
        array[lo:hi] = region
        return at + width

    def quality_summary(self) -> dict[str, Any] | None:
        """The measures' spread over the slide's tiles (`tilestore.qc.tilewise.summarise`),
        None where the group stores none."""
        if self.quality is None:
            return None
        if self._summary is None:  # read once between writes (finishing asks, then the report)
            from tilestore.qc.tilewise import summarise

            found = summarise(self.quality[:], list(self.quality.attrs["measures"]))
            self._summary = {**found, "note": self.quality_note} if self.quality_note else found
        return self._summary

    def finish(self, summary: dict[str, Any]) -> None:
        """Write what waits; mark complete (if every batch is done), release the lock. A
        slice (attached) only writes what waits."""
        if self.attached:
            self.flush()
            return
        try:
            self._made_group()
            self.flush()
            self._check_lock()
            if len(self.todo()) == 0:
                record = self._record(self.group)
                record = record.replace(complete=True, finished=_now(), run=summary)
                if self.quality is not None:
                    record = record.replace(quality_summary=self.quality_summary())
                with writing(self.slide.name, f"{self.path}'s record"):
                    write_record(self.group, record)
        finally:
            self._release_lock()

    def abandon(self) -> str:
        """Release the lock after a failure and say what the store holds now: a group this
        run made and wrote nothing into is removed (the store is as it was); otherwise the
        done batches stay for the next run to resume from. Attached (a slice), or never
        made: ""."""
        try:
            if self.group is None:  # never made (or its making failed, and was removed)
                return ""
            if self._lock is not None and self._lock.lost:  # another run writes it now
                self._pending.clear()
                return f"{self._lock.lost}: its batches are that run's to write"
            try:  # batches computed before the failure are kept
                self.flush()
            except (OSError, StoreError, ValueError, zarr.errors.BaseZarrError):
                self._pending.clear()  # not written (a full disk): their batches are redone
            if self.attached:  # the coordinator that made the group says what it holds
                return ""
            done = int(self._done[:].sum())
            if done == 0 and self._made:
                try:
                    _removed(self.root, self.path)
                    folder = self.path.rsplit("/", 1)[0]  # embeddings/<model>, made for it
                    if folder != self.path and not _members(self.root, folder):
                        del self.root[folder]
                except OSError as exc:  # a read-only file system: it stays, never complete
                    return f"nothing was written; {self.path} stays empty ({exc.strerror})"
                return f"nothing was written: {self.path} removed, the store is as it was"
            return (
                f"{done} of {self.blocks} batches of {self.path} are written and kept: rerun "
                "the same command to resume"
            )
        finally:
            self._release_lock()

    # -- creation ---------------------------------------------------------------------------

    def _existing(self):
        """The group as a run left it: None where there is none, or where a run was killed
        while making it (no attributes yet, so no batch was written: it is made again)."""
        try:
            group = self.root[self.path]
            if holds_record(group) and "done" in group:
                return group
        except KeyError:
            return None
        except (ValueError, TypeError, zarr.errors.BaseZarrError) as exc:
            raise EmbeddingError(
                f"{self.slide.name}: {self.path} is damaged ({type(exc).__name__}: {exc}); "
                "pass overwrite=True to embed again"
            ) from exc
        _removed(self.root, self.path)  # we hold the lock: nobody else is making it
        return None

    def _create(self) -> tuple[zarr.Group, tuple[dict, dict]]:
        """Make the group; return it, with its arrays and their positions' records as made
        (`_open` takes them as they are, never opened again). Its arrays are made at once,
        their positions at once after them (`made_new`: the files zarr makes, without its
        machinery a file; a group is some 25 arrays; bench/RESULTS.md, issue 68)."""
        plan, slide = self.plan, self.slide
        n, dim = len(plan), self.run.model["output_dim"]
        blocks = -(-n // self.batch_size)
        group = self.root.require_group(self.path)
        mpp = slide.mpp or (None, None)
        coords = {
            "x": plan.x,
            "y": plan.y,
            "x_um": plan.x * mpp[0] if mpp[0] else np.full(n, np.nan),
            "y_um": plan.y * mpp[1] if mpp[1] else np.full(n, np.nan),
            "row": plan.row,
            "col": plan.col,
            "tissue": plan.tissue,
            "roi": plan.roi,
            "roi_class": plan.roi_class,
            **{f"qc_{name}": share for name, share in plan.qc.items()},
        }
        arrays: dict[str, dict[str, Any]] = {  # each array's `create_array` arguments
            key: {
                "data": np.ascontiguousarray(values),
                "dimension_names": ("tile",),
                **column(zstd_codecs(level=3), n),
                "attributes": {"units": UNITS[key]} if key in UNITS else None,
            }
            for key, values in coords.items()
        }
        per = batches_per_shard(self.batch_size, self.run.shard_tiles or SHARD_TILES)
        if self.run.tokens:  # a shard's rows wait in memory whole: keep them to TOKENS_WAITING
            grid, width = self.run.tokens["grid"], self.run.tokens["dim"]
            row = (dim + grid[0] * grid[1] * width) * np.dtype(self.run.dtype).itemsize
            per = max(1, min(per, TOKENS_WAITING // (row * self.batch_size)))
        batch = (self.batch_size, dim)
        arrays["features"] = {
            "shape": (n, dim),
            "dtype": self.run.dtype,
            "dimension_names": ("tile", "feature"),
            **sharded(zstd_codecs(level=1), batch, (per * self.batch_size, dim), True),
            "fill_value": np.nan,
            "attributes": {"coordinates": " ".join(coords)},  # xarray: these are coordinates
        }
        if self.run.tokens:
            grid, width = self.run.tokens["grid"], self.run.tokens["dim"]
            tile_bytes = grid[0] * grid[1] * width * np.dtype(self.run.dtype).itemsize
            most = max(1, TOKENS_CHUNK // tile_bytes)  # a tile's grid reads little around it
            inner = max(
                d for d in range(1, self.batch_size + 1) if self.batch_size % d == 0 and d <= most
            )
            arrays["tokens"] = {
                "shape": (n, *grid, width),
                "dtype": self.run.dtype,
                "dimension_names": ("tile", "token_y", "token_x", "token_feature"),
                # zstd 1 shrinks float16 token grids by only 8% (ViT-S, 150 -> 138 KB a tile),
                # but a full grid is written at the disk's speed: on the lent H100 the run
                # was 10-20% slower uncompressed (bench/RESULTS.md, tokens)
                **sharded(
                    zstd_codecs(level=1),
                    (inner, *grid, width),
                    (per * self.batch_size, *grid, width),
                    True,
                ),
                "fill_value": np.nan,
            }
        if self.run.quality:
            measures = list(self.run.quality["measures"])
            arrays["quality"] = {
                "shape": (n, len(measures)),
                "dtype": "float32",
                "dimension_names": ("tile", "measure"),
                **sharded(
                    zstd_codecs(level=3),
                    (self.batch_size, len(measures)),
                    (per * self.batch_size, len(measures)),
                    True,
                ),
                "fill_value": np.nan,
                "attributes": {"measures": measures},
            }
        arrays["done"] = {
            "shape": (blocks,),
            "dtype": "uint8",
            "fill_value": 0,
            "dimension_names": ("batch",),
            **sharded({"compressors": [Crc32cCodec()]}, (1,), (per,), True),
        }
        made = _created(group, arrays)
        batched = ["features", *(k for k in ("tokens", "quality") if k in made), "done"]
        # the columns' positions now, the batched arrays' as their shards are written; the
        # record last: a group without it is a killed run's, made again
        held, records = tied.started(group, made, list(coords), batched)
        scale = scale_of(plan.spec)  # what the readers compare (`combine`), from the plan
        record = EmbeddingsRecord.make(
            f"{slide.name}: {self.path}",
            **self.identity,
            **{tied.RECORD: held},
            tiles=n,
            tile_size=scale.tile,
            mpp=scale.mpp,
            level=plan.spec.level,
            read_px=plan.spec.read,
            grid=asdict(plan.spec),
            classes=plan.classes,
            qc_classes=list(plan.qc),
            coordinates=COORDINATES,
            software=software_versions("torch", "timm", "huggingface_hub", "tifffile"),
            started=_now(),
            complete=False,
        )
        write_record(group, record)
        return group, (made, records)

    def _record(self, group) -> EmbeddingsRecord:
        """The record of the group this writer makes or resumes (KeyError: none)."""
        record = read_record(group, EmbeddingsRecord, f"{self.slide.name}: {self.path}", AGAIN)
        if record is None:
            raise KeyError(f"{self.path}'s record")
        return record

    def _refuse_unknown_weights(self, group) -> None:
        """EmbeddingError where the unfinished group's weights, or this run's, are not known
        (`weights_unknown`): another run's batches would be features of other weights."""
        made = weights_unknown(dict(self._record(group).model or {}))
        now = weights_unknown(self.run.model)
        if made is None and now is None:
            return
        whose = f"an unfinished {self.path} was made" if made else "this run's model is"
        raise EmbeddingError(
            f"{self.slide.name}: {whose} with {made or now} (weights unknown), which no run "
            f"draws again: {self.path} cannot be resumed; pass overwrite=True to embed it again"
        )

    def _compatible(self, group) -> bool:
        return not self._differing(group)

    def _differing(self, group) -> list[str]:
        """The identity's fields the group records otherwise. A group begun before the
        weights' sha256 was recorded is compared without it (as `recipe` compares groups:
        on the facts they have), so it resumes."""
        stored = self._record(group)
        diff = []
        for key, value in self.identity.items():
            was = stored.get(key)
            if key == "model" and isinstance(value, dict) and "weights_sha256" not in (was or {}):
                value = {k: v for k, v in value.items() if k != "weights_sha256"}
            if was != value:
                diff.append(key)
        return diff

    def _mismatch(self, group) -> str:
        diff = self._differing(group)
        return (
            f"{self.slide.name}: an unfinished {self.path} was made with other settings "
            f"({', '.join(diff)}); rerun with the same options to resume, or overwrite=True"
        )

    # -- locking ------------------------------------------------------------------------------

    def _take_lock(self, break_lock: bool, lock_for: int | None = None) -> None:
        """Take the group's lock, taking over one whose holder is gone (`locks.gone`: this
        host's dead pid, or no heartbeat for `locks.STALE`) or, with break_lock, any: said
        in one line (a TilestoreWarning) naming whose and why."""
        try:
            self._lock = locks.claim(self.lock_path, force=break_lock, caller=lock_for)
        except locks.Locked as held:
            holder = held.holder
            beat = locks.describe(holder, time.time())
            raise EmbeddingError(
                f"{self.slide.name}: {self.path} is being written by pid {holder.pid} "
                f"on {holder.host} since {holder.since}{beat}; if that job is dead, rerun "
                f"with break_lock=True (or delete {held.path}); a lock without a heartbeat "
                f"for {locks.span(locks.STALE)} is taken over by the next run"
            ) from None
        if self._lock.took_over:
            warnings.warn(f"{self.slide.name}: {self._lock.took_over}", TilestoreWarning, 2)

    @property
    def took_over(self) -> str | None:
        """The line saying whose lock this writer took over to write (None: it was free)."""
        return self._lock.took_over if self._lock is not None else None

    def _check_lock(self) -> None:
        """EmbeddingError where the lock was taken over by another run since (its holder
        found this run silent, or was told to break it): nothing more is written here."""
        if self._lock is not None and self._lock.lost:
            raise EmbeddingError(
                f"{self.slide.name}: {self._lock.lost}; this run stops writing {self.path}"
            )

    def _release_lock(self) -> None:
        if self._lock is not None:
            # a read-only file system: left, its process's; the next run on this host takes
            # it over once this process is gone (`locks.gone`)
            with contextlib.suppress(OSError):
                self._lock.release()
            self._lock = None


def _created(group: zarr.Group, arrays: dict[str, dict[str, Any]]) -> dict[str, zarr.Array]:
    """Make the group's `arrays` (name: `create_array`'s arguments) at once (`made_new`);
    return them."""
    paths = {name: f"{group.path}/{name}".lstrip("/") for name in arrays}
    made = made_new(group.store_path.store, {paths[n]: kw for n, kw in arrays.items()})
    return {name: made[paths[name]] for name in arrays}


def _removed(root: zarr.Group, path: str) -> None:
    """Remove the group at `path`, its own document (its record) first: a removal cut short
    (its process killed: a store process ends the moment its run is gone) leaves files that
    a rerun removes (`_existing`: no record), never a group with its record and some of its
    arrays gone, which a rerun would take for one to resume and find damaged."""
    sync((root.store_path / path / "zarr.json").delete())
    del root[path]


def make_group(store: str, plan: TilePlan, plan_uid: str, identity: RunIdentity) -> None:
    """Make a run's embeddings group for `plan` in `store` as `EmbeddingWriter.create` does
    (its caller holds the group's lock, and removes what is made where this fails)."""
    from tilestore.reading.opening import open_slide

    writer = EmbeddingWriter.__new__(EmbeddingWriter)
    writer._setup(open_slide(store), plan, plan_uid, identity)
    writer._create()


def _members(root, folder: str) -> bool:
    """Whether the group `folder` holds anything; True where it is gone (nothing to remove)."""
    try:
        return any(True for _ in root[folder].members())
    except KeyError:
        return True  # not there (or not a group): nothing of ours to remove


def _directory(slide: Slide) -> Path:
    root = getattr(slide.group.store, "root", None)
    if root is None:
        raise EmbeddingError(f"{slide.name}: embeddings can only be written to a local store")
    return Path(root)


def lock_file(store: Path, path: str) -> Path:
    """The lock a run writing the group `path` of the store at `store` holds: beside the
    store, not in it (zarr would list it, and overwrite=True deletes the group):
    .<store>.<model>.<plan>.lock (a store made before's embeddings/<model>: .<store>.<model>.lock,
    as before)."""
    return store.parent / f".{store.name}.{'.'.join(path.split('/')[1:])}.lock"


def _quality_scale(plan: TilePlan, quality: dict[str, Any] | None) -> str | None:
    """Why a plan's tiles cannot be measured at the run's scales (None: they can): the
    measures' widths are micrometres at the run's um/px, so tiles of another resolution
    would be judged at the wrong scale; their measures are left NaN, not judged."""
    if not quality:
        return None
    scale = scale_of(plan.spec)
    mpp, side = scale.mpp, quality.get("side", scale.tile)
    if mpp is None:
        return "quality not judged: the plan's tiles have no pixel size"
    if abs(mpp / quality["mpp"] - 1) > QUALITY_TOLERANCE or scale.tile != side:
        return (
            f"quality not judged: the plan's tiles are {scale.tile} px at {mpp:.3g} um/px "
            f"and the measures are taken on {side} px at {quality['mpp']:g} um/px (the run's)"
        )
    return None


def _now() -> str:
    """When a group was started or finished, to the microsecond: what slide vectors and
    scores are tied to (a group embedded again within the second it was first finished in
    is then another group, not the same one)."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")


def write_features(
    store: str | os.PathLike,
    model: dict[str, Any],
    features: np.ndarray,
    *,
    plan: str | None = None,
    batch_size: int = 512,
    overwrite: bool = False,
) -> str:
    """Store tile features made elsewhere (another tool, a benchmark's) as the embeddings
    group of ``model["name"]``: one row per tile of a stored plan, in the plan's order.

    model: what the features are ({"name": ..., and whatever says where they came from}).
    plan: the stored plan's name (None: the store's only plan). Returns the group's path.
    Features with a NaN or an infinity are refused: readers take those for damage."""
    from tilestore.plan import load_plan
    from tilestore.reading.opening import open_slide

    slide = open_slide(store)
    tile_plan, uid = load_plan(slide, plan)
    if features.ndim != 2 or len(features) != len(tile_plan):
        raise EmbeddingError(
            f"{slide.name}: {features.shape} features for the {len(tile_plan)} tiles of plan "
            f"{tile_plan.name}"
        )
    bad = non_finite_rows(features)  # a finished group holds finite features only
    if len(bad):
        raise EmbeddingError(
            f"{slide.name}: the features given hold NaN or infinite values in {len(bad)} "
            f"row(s) ({', '.join(map(str, bad[:5].tolist()))}{', ...' if len(bad) > 5 else ''}); "
            "nothing was written"
        )
    dtype = "float16" if features.dtype == np.float16 else "float32"
    model = {**model, "output_dim": int(features.shape[1])}
    identity = RunIdentity(model, batch_size, dtype, precision="given", compile=False)
    writer = EmbeddingWriter(slide, tile_plan, uid, identity, overwrite=overwrite)
    try:
        for block in writer.todo():
            writer.write(int(block), features[block * batch_size : (block + 1) * batch_size])
        writer.finish({"written_by": "write_features"})
    except BaseException:
        writer.abandon()
        raise
    return writer.path
