"""What each kind of group inside a store says about itself: one typed record per kind,
beside the store's own (`tilestore.format.record.StoreRecord`).

A plan (``plans/<name>``: `PlanRecord`), an embeddings group
(``embeddings/<model>/<plan>``: `EmbeddingsRecord`), a slide embedding
(``.../slides/<encoder>``: `SlideVectorRecord`), a set of zero-shot scores
(``.../zeroshot/<name>``: `ScoresRecord`), a trained model's tile scores
(``.../learned/<run>``: `LearnedRecord`), a label image (``labels/<name>``: `LabelRecord`)
and a sidecar level's tile checksums (``tile_crc32c/<level>``: `TileSumsRecord`) each keep
their record in their ``tilestore`` attributes. It is read once (`read_record`: `parse`
checks the type of every fact a reader asks; a wrong type is one StoreError naming the
group and the key), asked by its fields, and written by one function (`write_record`). A
fact a record does not name (written by a newer version, or by hand) is kept as it was and
written back, every key in the place it was written: a record read and written again is
byte for byte what it was. No other module looks the key up in the raw attributes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import zarr

from tilestore.errors import DamagedEmbeddings, StoreError
from tilestore.format.record import ATTRS_KEY, StoreRecord

R = TypeVar("R", bound="GroupRecord")


@dataclass(frozen=True)
class GroupRecord:
    """A group's record: `facts`, every key as written and in that order (what `to_attrs`
    writes back), and the typed fields each kind names (parsed from them once)."""

    facts: Mapping[str, Any] = field(default_factory=dict)

    KIND: ClassVar[str] = "group"  # what the errors call it
    FIX: ClassVar[str] = "make it again"  # what to do where it is damaged
    ERROR: ClassVar[type[StoreError]] = StoreError  # what a damaged one raises

    @classmethod
    def parse(cls: type[R], attrs: object, where: object, fix: str = "") -> R:
        """The record from a group's ``tilestore`` attributes; StoreError naming the group
        (`where`) and the key where one is not of the type written."""
        try:
            if not isinstance(attrs, Mapping):
                raise TypeError(f"the record is {type(attrs).__name__}, not an object")
            facts = dict(attrs)
            return cls(facts=facts, **cls._typed(facts))
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise cls.ERROR(
                f"{where}: its {cls.KIND} record is damaged ({type(exc).__name__}: {exc}); "
                f"{fix or cls.FIX}"
            ) from exc

    @classmethod
    def make(cls: type[R], where: object = "", /, **facts: Any) -> R:
        """A new record of these facts, in this order (what a writer writes)."""
        return cls.parse(facts, where)

    @classmethod
    def _typed(cls, facts: dict[str, Any]) -> dict[str, Any]:
        return {}

    def get(self, key: str, default: Any = None) -> Any:
        """A recorded fact, as stored (one the record does not name, or the whole of one it
        names: the identity a run compares, a grid given to a reader)."""
        return self.facts.get(key, default)

    def __contains__(self, key: str) -> bool:
        return key in self.facts

    def replace(self: R, **changes: Any) -> R:
        """This record with these facts changed (each in its place) or added (at the end)."""
        return type(self).parse({**self.facts, **changes}, self.KIND)

    def to_attrs(self) -> dict[str, Any]:
        """The ``tilestore`` attributes that say this record, every key where it was."""
        return dict(self.facts)


# -- the checks: a fact of the wrong type names its key -------------------------------------


def _int(facts: Mapping, key: str, default: int | None = None) -> int | None:
    value = facts.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f"{key} is {type(value).__name__}, not an integer")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{key} is {value!r}, not an integer") from None


def _str(facts: Mapping, key: str) -> str | None:
    value = facts.get(key)
    if value is None:
        return None
    if isinstance(value, dict | list):
        raise TypeError(f"{key} is {type(value).__name__}, not a string")
    return str(value)


def _obj(facts: Mapping, key: str) -> dict[str, Any] | None:
    value = facts.get(key)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(f"{key} is {type(value).__name__}, not an object")
    return dict(value)


def _list(facts: Mapping, key: str) -> list | None:
    value = facts.get(key)
    if value is None:
        return None
    if not isinstance(value, list | tuple):
        raise TypeError(f"{key} is {type(value).__name__}, not a list")
    return list(value)


# -- the kinds ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanRecord(GroupRecord):
    """A stored plan's record (``plans/<name>``): its uid, whether it was stored whole, its
    tiles' count; its grid, classes, chunk shape, params, recipe and notes as written."""

    uid: str | None = None
    complete: bool = False
    tiles: int | None = None
    spec: Mapping[str, Any] | None = None
    classes: tuple[str, ...] = ()
    qc_classes: tuple[str, ...] = ()
    chunk_shape: tuple[int, ...] = ()
    params: Mapping[str, Any] | None = None
    recipe: Mapping[str, Any] | None = None
    notes: tuple[str, ...] = ()

    KIND: ClassVar[str] = "plan"
    FIX: ClassVar[str] = "make it again with overwrite=True"

    @classmethod
    def _typed(cls, facts: dict[str, Any]) -> dict[str, Any]:
        return {
            "uid": _str(facts, "uid"),
            "complete": bool(facts.get("complete")),
            "tiles": _int(facts, "tiles"),
            "spec": _obj(facts, "spec"),
            "classes": tuple(str(c) for c in _list(facts, "classes") or ()),
            "qc_classes": tuple(str(c) for c in _list(facts, "qc_classes") or ()),
            "chunk_shape": tuple(int(c) for c in _list(facts, "chunk_shape") or ()),
            "params": _obj(facts, "params"),
            "recipe": _obj(facts, "recipe"),
            "notes": tuple(str(n) for n in _list(facts, "notes") or ()),
        }


@dataclass(frozen=True)
class EmbeddingsRecord(GroupRecord):
    """An embeddings group's record (``embeddings/<model>/<plan>``): whether it is
    complete, when it was finished, the plan it was made from (name, uid), the model (its
    name and weights), its tiles, batch size and dtype; the rest of its run's identity, its
    grid and its positions as written."""

    complete: bool = False
    finished: str = ""  # "" until finished: what slide vectors and scores are tied to
    plan: Mapping[str, Any] = field(default_factory=dict)
    model: Mapping[str, Any] | None = None
    tiles: int | None = None
    batch_size: int | None = None
    dtype: str | None = None

    KIND: ClassVar[str] = "embeddings group"
    FIX: ClassVar[str] = "embed the store again with overwrite=True"
    ERROR: ClassVar[type[StoreError]] = DamagedEmbeddings

    @classmethod
    def _typed(cls, facts: dict[str, Any]) -> dict[str, Any]:
        return {
            "complete": bool(facts.get("complete")),
            "finished": str(facts.get("finished", "")),
            "plan": _obj(facts, "plan") or {},
            "model": _obj(facts, "model"),
            "tiles": _int(facts, "tiles"),
            "batch_size": _int(facts, "batch_size"),
            "dtype": _str(facts, "dtype"),
        }

    @property
    def plan_name(self) -> str | None:
        """The name of the plan the group was made from (None: not recorded)."""
        name = self.plan.get("name")
        return None if name is None else str(name)

    @property
    def plan_uid(self) -> str | None:
        """The uid of the plan the group was made from (None: not recorded)."""
        return self.plan.get("uid")

    @property
    def model_name(self) -> str | None:
        """The model's name as the run recorded it."""
        name = (self.model or {}).get("name")
        return None if name is None else str(name)

    @property
    def batched(self) -> bool:
        """Whether it records a batch size (an embeddings group, not another kind)."""
        return "batch_size" in self.facts


@dataclass(frozen=True)
class SlideVectorRecord(GroupRecord):
    """A slide embedding's record (``.../slides/<encoder>``): its width, its encoder, the
    tile group it was computed from (when that was finished), and the group of the tiles
    that guided it where its encoder reads a second model's (EAGLE)."""

    dim: int | None = None
    encoder: str | None = None
    tiles: Mapping[str, Any] = field(default_factory=dict)
    guide: Mapping[str, Any] = field(default_factory=dict)  # the guide model's tiles (EAGLE)

    KIND: ClassVar[str] = "slide embedding"
    FIX: ClassVar[str] = "compute it again"
    ERROR: ClassVar[type[StoreError]] = DamagedEmbeddings

    @classmethod
    def _typed(cls, facts: dict[str, Any]) -> dict[str, Any]:
        return {
            "dim": _int(facts, "dim"),
            "encoder": _str(facts, "encoder"),
            "tiles": _obj(facts, "tiles") or {},
            "guide": _obj(facts, "guide") or {},
        }

    @property
    def made_from(self) -> str:
        """When the tile group it was computed from was finished ("" where not recorded)."""
        return str(self.tiles.get("finished", ""))


@dataclass(frozen=True)
class ScoresRecord(GroupRecord):
    """A set of zero-shot scores' record (``.../zeroshot/<name>``): its classes (the
    columns) and the tile group it was scored from (when that was finished)."""

    classes: tuple[str, ...] = ()
    tiles: Mapping[str, Any] = field(default_factory=dict)

    KIND: ClassVar[str] = "scores"
    FIX: ClassVar[str] = "classify the store again"

    @classmethod
    def _typed(cls, facts: dict[str, Any]) -> dict[str, Any]:
        return {
            "classes": tuple(str(c) for c in _list(facts, "classes") or ()),
            "tiles": _obj(facts, "tiles") or {},
        }

    @property
    def made_from(self) -> str:
        """When the tile group it was scored from was finished ("" where not recorded)."""
        return str(self.tiles.get("finished", ""))


@dataclass(frozen=True)
class LearnedRecord(GroupRecord):
    """A trained model's per-tile scores' record (``.../learned/<run>``, written by
    `tilestore.learn.explanation`): its columns (``attention`` where the model has one, then
    each output's contribution), the run that made them (its folder, model, task and the
    feature recipe it was trained on) and the tile group it scored (when that was finished)."""

    columns: tuple[str, ...] = ()
    run: Mapping[str, Any] = field(default_factory=dict)
    tiles: Mapping[str, Any] = field(default_factory=dict)

    KIND: ClassVar[str] = "learned scores"
    FIX: ClassVar[str] = "explain the store again (tilestore predict --explain)"

    @classmethod
    def _typed(cls, facts: dict[str, Any]) -> dict[str, Any]:
        return {
            "columns": tuple(str(c) for c in _list(facts, "columns") or ()),
            "run": _obj(facts, "run") or {},
            "tiles": _obj(facts, "tiles") or {},
        }

    @property
    def made_from(self) -> str:
        """When the tile group it was scored from was finished ("" where not recorded)."""
        return str(self.tiles.get("finished", ""))


@dataclass(frozen=True)
class LabelRecord(GroupRecord):
    """A label image's record (``labels/<name>``): its downsample from level 0 and what
    made it (method, polarity, fraction, mpp... as the kind of label records them)."""

    downsample: tuple[float, float] | None = None

    KIND: ClassVar[str] = "label"
    FIX: ClassVar[str] = "compute it again"

    @classmethod
    def _typed(cls, facts: dict[str, Any]) -> dict[str, Any]:
        found = _list(facts, "downsample")
        return {"downsample": None if not found else (float(found[0]), float(found[1]))}


@dataclass(frozen=True)
class TileSumsRecord(GroupRecord):
    """A sidecar level's tile checksums' record (an array's, ``tile_crc32c/<level>``): the
    level, the value of a tile not written, the CRC-32C of the slide's tables."""

    level: str | None = None
    unwritten: int | None = None
    tables_crc32c: int | None = None

    KIND: ClassVar[str] = "tile checksums"
    FIX: ClassVar[str] = "remove the sidecar to make it again"

    @classmethod
    def _typed(cls, facts: dict[str, Any]) -> dict[str, Any]:
        return {
            "level": _str(facts, "tile_crc32c_of"),
            "unwritten": _int(facts, "unwritten"),
            "tables_crc32c": _int(facts, "tables_crc32c"),
        }


# -- the one reader and the one writer --------------------------------------------------------


def read_record(
    node: zarr.Group | zarr.Array, kind: type[R], where: object = None, fix: str = ""
) -> R | None:
    """The record of kind `kind` of a group (or array): None where it holds none; StoreError
    naming it (`where`, default its path) and the key where it is damaged."""
    attrs = node.attrs.get(ATTRS_KEY)
    if attrs is None:
        return None
    return kind.parse(attrs, node.path if where is None else where, fix)


def holds_record(node: zarr.Group | zarr.Array) -> bool:
    """Whether a group (or array) holds a record written whole: an object of facts (none, or
    something else, is what a run killed while making the group leaves, made again)."""
    return isinstance(node.attrs.get(ATTRS_KEY), Mapping)


def written_record(
    node: zarr.Group | zarr.Array, kind: type[R], where: object = None, fix: str = ""
) -> R | None:
    """The record of a group whose maker wrote one whole (`holds_record`), else None;
    StoreError naming it and the key where an object of facts is damaged."""
    if not holds_record(node):
        return None
    return read_record(node, kind, where, fix)


def find_record(node: zarr.Group | zarr.Array, kind: type[R]) -> R | None:
    """The record of a group (or array) where it holds one that can be read, else None (no
    record, or a damaged one: for those who only look, never judge)."""
    try:
        return read_record(node, kind)
    except StoreError:
        return None


def attrs_of(record: GroupRecord | StoreRecord) -> dict[str, Any]:
    """The attributes that hold `record` (for a node made with its attributes at once)."""
    return {ATTRS_KEY: record.to_attrs()}


def write_record(node: zarr.Group | zarr.Array, record: GroupRecord | StoreRecord) -> None:
    """Write a record (a group's, or the store's own at its root) into its node."""
    node.attrs[ATTRS_KEY] = record.to_attrs()
