"""What a store says about itself: the typed record of its ``tilestore`` attributes.

The converter writes it (`StoreRecord.to_attrs`), `open_group` reads and checks it
(`StoreRecord.parse`: a value of the wrong type is one StoreError naming the store and the
attribute), and every reader asks its fields: the levels and their scales, the pixel size,
the channels, whether the pixels are one RGB picture, the modality, the background, what the
chunks carry (checksums, positions), where a sidecar's slide is and which of its levels are
read in place. No other module looks a key up in the raw attributes. A key the record does
not name (written by a newer version, or by hand) is kept as it was and written back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tilestore.errors import StoreError

ATTRS_KEY = "tilestore"  # the root group's attribute holding the record

# Plausible level-0 pixel sizes, um/px, inclusive: the one range for a size a file states
# (`tilestore.sources.base.checked_mpp`) and a size a user gives (`tilestore.reading.ScanMpp`:
# `convert --mpp`, `embed --scan-mpp`). Below it no light microscope resolves (a 0.001 um/px
# slide of 1 cm would be 10^7 px a side; 1e-7 made a 0x0 grid); above it a resolution tag is
# a screen or print density (72 dpi = 352.8 um/px), not a scan.
MPP_RANGE = (0.01, 100.0)

# The origin of a level-0 size the user gave over the one the file states (`Mpp.file`).
OVERRIDE = "override"


@dataclass(frozen=True)
class LevelRecord:
    """One image level: its array's path, its downsample (dy, dx) from level 0, and what
    the conversion says of it (how it was written, its codec's loss...)."""

    path: str
    downsample: tuple[float, float]
    facts: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Mpp:
    """Level-0 micrometres per pixel and where the value came from; `file`: where the user
    replaced the size the file states (origin `OVERRIDE`), the file's own, else None."""

    x: float
    y: float
    origin: str | None = None
    file: Mpp | None = None

    @property
    def overridden(self) -> bool:
        """The user's size, given over the file's (`convert(override_mpp=True)`)."""
        return self.origin == OVERRIDE

    def to_attrs(self) -> dict[str, Any]:
        """As the store records it: {x, y, origin, file} (origin, file where known)."""
        return {
            "x": self.x,
            "y": self.y,
            **({"origin": self.origin} if self.origin else {}),
            **({"file": self.file.to_attrs()} if self.file else {}),
        }


@dataclass(frozen=True)
class Integrity:
    """What a reader may rely on: every chunk written (absent means glass only where the
    store says it), each ending with its checksum, each checksum recorded by position."""

    every_chunk: bool = False
    checksum: str | None = None
    positions: str | None = None  # how they are recorded; None: not tied to positions


@dataclass(frozen=True)
class SourceRecord:
    """The slide a store was made from; a sidecar's also where it is and which levels are
    read from it in place (the rest of what was recorded in `facts`)."""

    name: str | None = None
    path: str | None = None
    size: int | None = None
    mtime_ns: int | None = None  # its files' latest modification time, as converted
    sha256: str | None = None  # of its files' bytes (a converted store's, once complete)
    fingerprint: str | None = None
    in_place: tuple[int, ...] = ()
    decoded: tuple[int, ...] = ()
    # how a sidecar records its in-place levels' tiles' CRC-32C (`tilestore.reading.inplace`);
    # None: made before, its tiles not checked by content
    tile_sums: str | None = None
    facts: Mapping[str, Any] = field(default_factory=dict)

    @property
    def sidecar(self) -> bool:
        """A slide's sidecar store (its levels read in place from the slide)."""
        return self.fingerprint is not None

    @classmethod
    def of(cls, facts: Mapping[str, Any] | None) -> SourceRecord:
        """The record of what was recorded of the source (typed where readers ask)."""
        facts = _dict(facts, "source") or {}
        return cls(
            name=facts.get("name"),
            path=facts.get("path"),
            size=None if facts.get("size") is None else int(facts["size"]),
            mtime_ns=None if facts.get("mtime_ns") is None else int(facts["mtime_ns"]),
            sha256=facts.get("sha256"),
            fingerprint=facts.get("fingerprint"),
            in_place=tuple(int(i) for i in facts.get("in_place", ())),
            decoded=tuple(int(i) for i in facts.get("decoded", ())),
            tile_sums=facts.get("tile_crc32c"),
            facts=facts,
        )


@dataclass(frozen=True)
class StoreRecord:
    """A store's record of itself (see the module docstring)."""

    levels: tuple[LevelRecord, ...]
    complete: bool = False
    mpp: Mpp | None = None
    channels: tuple[str, ...] = ()
    rgb: bool = True
    modality: Mapping[str, Any] | None = None  # the fact: value (brightfield...) and origin
    background: int = 0
    integrity: Integrity = Integrity()
    source: SourceRecord = SourceRecord()
    verified: Mapping[str, Any] | None = None
    others: Mapping[str, Any] = field(default_factory=dict)  # every key not named above

    @property
    def fluorescence(self) -> bool:
        """A fluorescence scan (dark background, markers as channels)."""
        return (self.modality or {}).get("value") == "fluorescence"

    def get(self, key: str, default: Any = None) -> Any:
        """A recorded fact the record does not name (codec, objective_power, associated,
        software, created, store_format...), as stored."""
        return self.others.get(key, default)

    def replace(self, **changes: Any) -> StoreRecord:
        return dataclasses.replace(self, **changes)

    def with_fact(self, key: str, value: Any) -> StoreRecord:
        """This record with one more fact of those it does not name."""
        return self.replace(others={**self.others, key: value})

    @classmethod
    def parse(cls, attrs: Mapping[str, Any], where: object) -> StoreRecord:
        """The record from a store's ``tilestore`` attributes; StoreError naming the store
        and the attribute where one is not of the type written."""
        named = {"levels", "complete", "mpp", "channels", "rgb", "modality", "background",
                 "integrity", "source", "verified"}  # fmt: skip
        try:
            return cls(
                levels=tuple(
                    LevelRecord(
                        str(lv["path"]),
                        (float(lv["downsample"][0]), float(lv["downsample"][1])),
                        dict(lv),
                    )
                    for lv in _list(attrs["levels"], "levels")
                ),
                complete=bool(attrs.get("complete", False)),
                mpp=_mpp(attrs.get("mpp")),
                channels=tuple(str(c) for c in _list(attrs.get("channels") or [], "channels")),
                rgb=bool(attrs.get("rgb", True)),
                modality=_dict(attrs.get("modality"), "modality"),
                background=int(attrs.get("background", 0)),
                integrity=_integrity(attrs.get("integrity")),
                source=SourceRecord.of(attrs.get("source")),
                verified=_dict(attrs.get("verified"), "verified"),
                others={k: v for k, v in attrs.items() if k not in named},
            )
        except (KeyError, IndexError, TypeError, ValueError) as exc:  # incl. levels absent
            raise StoreError(
                f"{where}: its tilestore attributes are damaged ({type(exc).__name__}: {exc}); "
                "convert the slide again"
            ) from exc

    def to_attrs(self) -> dict[str, Any]:
        """The ``tilestore`` attributes that say this record; `complete` last (a store
        without it was interrupted)."""
        attrs: dict[str, Any] = dict(self.others)
        attrs.pop("complete", None)
        attrs.update(
            source=dict(self.source.facts),
            mpp=None if self.mpp is None else self.mpp.to_attrs(),
            modality=None if self.modality is None else dict(self.modality),
            background=self.background,
            channels=list(self.channels),
            rgb=self.rgb,
            integrity={
                "every_chunk": self.integrity.every_chunk,
                "checksum": self.integrity.checksum,
                **({"positions": self.integrity.positions} if self.integrity.positions else {}),
            },
            levels=[
                {**lv.facts, "path": lv.path, "downsample": list(lv.downsample)}
                for lv in self.levels
            ],
        )
        if self.verified is not None:
            attrs["verified"] = dict(self.verified)
        attrs["complete"] = self.complete
        return attrs


def _list(value: Any, what: str) -> list:
    if not isinstance(value, list | tuple):
        raise TypeError(f"{what} is {type(value).__name__}, not a list")
    return list(value)


def _dict(value: Any, what: str) -> dict | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(f"{what} is {type(value).__name__}, not an object")
    return dict(value)


def _mpp(value: Any) -> Mpp | None:
    if not value:
        return None
    value = _dict(value, "mpp")
    return Mpp(float(value["x"]), float(value["y"]), value.get("origin"), _mpp(value.get("file")))


def _integrity(value: Any) -> Integrity:
    value = _dict(value, "integrity") or {}
    return Integrity(
        bool(value.get("every_chunk", False)),
        value.get("checksum"),
        value.get("positions"),
    )
