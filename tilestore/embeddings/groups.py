"""A store's embeddings groups found and opened for reading: stores named or globbed, a
group opened (absent: KeyError; damaged: one StoreError), the slide's name. What the tile
reader (`read`), the slide-vector reader (`slides`) and the exports share.

What no reader may combine is refused here, once, for every reader: a finished group whose
arrays' shapes or dtypes disagree with each other or with its record, or whose chunks are
not those written at their positions (`check_group`, when it is opened: shard indexes and
4 bytes a chunk, `tilestore.embeddings.tied`), and stored values that are not finite
(`check_rows`, when they are read): a run writes every row of a finished group and only
finite ones, so any of these is damage. `status` and the writer judge damage with the same
`check_group`."""

from __future__ import annotations

import glob
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import zarr
from zarr.abc.store import Store

from tilestore.embeddings import tied
from tilestore.embeddings.layout import COORDS, GROUP, RESERVED, group_name, model_folder
from tilestore.errors import (
    DamagedEmbeddings,
    NotEmbedded,
    OptionError,
    StoreError,
    TilestoreWarning,
)
from tilestore.format.records import EmbeddingsRecord, PlanRecord, find_record, read_record
from tilestore.format.store import DAMAGED, STORE_SUFFIX, damage_as_store_error, members
from tilestore.format.store import open_group as open_store_group
from tilestore.sources.remote import is_url, url_store

StoreLike = str | os.PathLike | Store
T = TypeVar("T")


def list_embeddings(store: StoreLike) -> list[str]:
    """Names of the models with embeddings groups in a store (complete or not), as their
    folders are named (`layout.model_folder`)."""
    root = open_group(store, "")
    with damage_as_store_error(store, GROUP, f"remove {GROUP} and embed the store again"):
        try:
            return sorted(name for name, _ in root[GROUP].groups())
        except KeyError:
            return []


def _is_group(group: zarr.Group) -> bool:
    """Whether a group is an embeddings group (its record or its done flags: a run made it)."""
    record = find_record(group, EmbeddingsRecord)
    return (record is not None and "plan" in record) or "done" in group


def plan_groups(store: StoreLike, model: str) -> dict[str, str]:
    """{plan name: the group's path} of a model's embeddings groups in a store (complete or
    not): embeddings/<model>/<plan> each, and a store made before's embeddings/<model>
    itself, as the group of the plan its record names (`tilestore.embeddings.layout`)."""
    folder = model_folder(model)
    try:
        group = open_group(store, folder)
    except KeyError:
        return {}
    found: dict[str, str] = {}
    with damage_as_store_error(store, folder, embed_again(folder)):
        if _is_group(group):  # a store made before: the model's folder is its one group
            made = read_record(group, EmbeddingsRecord, f"{store}: {folder}")
            found[str(made.plan_name if made else None)] = folder
        for name, child in sorted(group.groups()):
            if name.startswith(".") or name in RESERVED or not _is_group(child):
                continue
            found.setdefault(name, f"{folder}/{name}")
    return found


def list_groups(store: StoreLike) -> list[tuple[str, str, str]]:
    """(model, plan, path) of every embeddings group of a store, models as their folders
    are named."""
    return [
        (model, plan, path)
        for model in list_embeddings(store)
        for plan, path in plan_groups(store, model).items()
    ]


def find_group(store: StoreLike, model: str, plan: str | None = None) -> str:
    """The path of a model's embeddings group in a store: of `plan`, or where the model has
    groups of one plan only, that one. KeyError where there is none (of that plan);
    OptionError naming them where several plans' groups are there and none is named."""
    found = plan_groups(store, model)
    if plan is not None:
        if plan not in found:
            raise KeyError(group_name(model, plan))
        return found[plan]
    if not found:
        raise KeyError(model_folder(model))
    if len(found) > 1:
        raise OptionError(
            f"{store}: {model!r} embeddings of {len(found)} plans ({', '.join(sorted(found))}); "
            "name one with plan=<name>"
        )
    return next(iter(found.values()))


def expand_stores(stores) -> list[tuple[StoreLike, bool]]:
    """(store, whether a glob pattern found it) for each store given: a store, a list of
    stores, or glob patterns ("stores/*.ome.zarr"; one that finds nothing is an error)."""
    if isinstance(stores, Store | str | os.PathLike):
        stores = [stores]
    out: list[tuple[StoreLike, bool]] = []
    for s in stores:
        if isinstance(s, str) and glob.has_magic(s):
            found = sorted(glob.glob(s))
            if not found:
                raise StoreError(f"{s}: no store matches this pattern")
            out.extend((f, True) for f in found)
        elif is_url(s):  # a store in a bucket: zarr's own FsspecStore reads it
            out.append((url_store(s), False))
        else:
            out.append((s, False))
    if not out:
        raise StoreError("no stores given")
    return out


def read_each(stores, read: Callable[[StoreLike], T], skip_missing: bool, nothing: str) -> list[T]:
    """read(store) for each store given (`expand_stores`). A store without what is read
    (NotEmbedded) is left out with a warning where skip_missing or a glob pattern found it,
    and raised where it was named; StoreError "<nothing> in <n> store(s)" where none is left."""
    found, skipped = [], []
    given = expand_stores(stores)
    for store, globbed in given:
        try:
            found.append(read(store))
        except NotEmbedded as exc:
            if not (skip_missing or globbed):
                raise
            skipped.append(str(exc))
    for reason in skipped:
        warnings.warn(f"skipped: {reason}", TilestoreWarning, stacklevel=3)
    if not found:
        raise StoreError(f"{nothing} in {len(given)} store(s)")
    return found


def refuse_shared_names(names: list[str]) -> None:
    """A cohort's slides are told apart by name: two stores of one name are refused."""
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise StoreError(f"two stores share the slide name {dup[0]!r}: rename one of them")


@dataclass(frozen=True)
class Finished:
    """A store's finished embeddings group as a reader opens it: the group, its path in the
    store, its record and its arrays (their metadata read once, their shapes checked:
    `check_shapes`)."""

    group: zarr.Group
    path: str
    record: EmbeddingsRecord
    arrays: dict[str, zarr.Array]

    @property
    def meta(self) -> dict[str, Any]:
        """Its record's facts, as written (what the readers' tables are made of)."""
        return self.record.to_attrs()

    @property
    def fix(self) -> str:
        return embed_again(self.path)


def embed_again(path: str) -> str:
    """What to do about a damaged embeddings group."""
    return f"embed the store again with overwrite=True (or remove {path})"


def open_finished(store: StoreLike, model: str, plan: str | None = None) -> Finished:
    """A store's finished embeddings group of `model` (of `plan`; None: the model's only
    plan's, `find_group`), its shapes checked (`check_shapes`). StoreError where the store is
    absent or the group damaged (DamagedEmbeddings where its shapes disagree); NotEmbedded
    where the group is absent or unfinished (how far it got); OptionError where the model
    has several plans' groups and none is named."""
    if not isinstance(store, Store) and not (Path(store) / "zarr.json").exists():
        raise StoreError(f"{store}: no such store")
    try:
        path = find_group(store, model, plan)
        group = open_group(store, path)
    except KeyError as exc:
        have = ", ".join(f"{m} ({p})" for m, p, _ in list_groups(store)) or "none"
        raise NotEmbedded(
            f"{store}: no {exc.args[0]} (embeddings in this store: {have}); embed the store "
            f"with model={model!r}{f' and plan={plan!r}' if plan else ''} first"
        ) from None
    with damage_as_store_error(store, path, embed_again(path)):
        record = read_record(group, EmbeddingsRecord, f"{store}: {path}", embed_again(path))
        meta = record or EmbeddingsRecord()
        if not meta.complete:
            done = group["done"][:]
            raise NotEmbedded(
                f"{store}: {path} is unfinished ({int(done.sum())} of {len(done)} batches); "
                "rerun the same `tilestore embed` command to finish it"
            )
        try:  # one round of concurrent metadata reads, not eleven
            arrays = {n: a for n, a in members(group) if isinstance(a, zarr.Array)}
        except ValueError as exc:
            raise DamagedEmbeddings(f"{store}: {path}/{exc}; {embed_again(path)}") from exc
        check_group(store, path, meta.to_attrs(), arrays)
    replaced = plan_replaced(store, meta)
    if replaced:
        raise NotEmbedded(
            f"{store}: {path} {replaced}: its tiles are not that plan's now; embed the store "
            "again with overwrite=True (or read it under another name: store the plan again "
            "as it was)"
        )
    return Finished(group, path, meta, arrays)


def plan_replaced(store: StoreLike, meta: EmbeddingsRecord) -> str:
    """How a group no longer stands for the plan it records ("" where it does): the plan of
    its name stored again since, with another uid (other tiles, or the same made
    otherwise). A plan no longer stored leaves the group as it is (its tiles' coordinates
    are its own). What `status` calls "other plan" and every reader refuses."""
    name = meta.plan_name
    if not name:
        return ""
    try:
        stored_plan = find_record(open_group(store, f"plans/{name}"), PlanRecord)
    except KeyError:
        return ""
    if stored_plan is None or stored_plan.uid in (None, meta.plan_uid):
        return ""
    return (
        f"was made from an earlier plan {name!r} (uid {meta.plan_uid}), stored again since "
        f"(uid {stored_plan.uid})"
    )


def check_group(
    store: StoreLike, path: str, meta: dict[str, Any], arrays: dict[str, zarr.Array], fix: str = ""
) -> np.ndarray:
    """The group's done flags, once it is what its runs wrote as far as can be told without
    reading its features: its record of the tiles' grid (`check_record`), its arrays' shapes
    (`check_shapes`) and dtypes as recorded, a group
    marked complete with every batch done, and its arrays' chunks the ones written at their
    positions (`tilestore.embeddings.tied.check`: shard indexes and 4 bytes a chunk). Else
    DamagedEmbeddings (a ChunkError for a damaged shard), one line naming the store, the
    array and the rows. The one judgement of damage that every reader's door (`open_finished`),
    `status` and the writer (`resume_state`: never "complete", never resumed) share. `fix`: what
    to do about it (default: `embed_again`)."""
    fix = fix or embed_again(path)
    where = f"{store}: {path}"
    check_record(store, path, meta)
    check_shapes(store, path, meta, arrays, fix)
    dtype = meta.get("dtype")  # what the run wrote (`RunIdentity.dtype`)
    for key in ("features", "tokens"):
        if dtype and key in arrays and str(arrays[key].dtype) != str(dtype):
            raise DamagedEmbeddings(
                f"{where}/{key} is {arrays[key].dtype} where the group records {dtype}: its "
                f"zarr.json was changed; it is damaged; {fix}"
            )
    if "done" not in arrays or arrays["done"].dtype != np.uint8:
        found = arrays["done"].dtype if "done" in arrays else "absent"
        raise DamagedEmbeddings(f"{where}/done is {found}, not uint8 flags: it is damaged; {fix}")
    ends = None
    if tied.tied_arrays(meta) is not None:  # its chunks' last 4 bytes: no slow zarr read
        ends = tied.ends(arrays["done"], f"{where}/done")
        flags = (ends == tied.DONE_CRC).astype(np.uint8)
    else:
        flags = arrays["done"][:]
    done, batches = int((flags == 1).sum()), len(flags)
    if meta.get("complete") and done < batches:
        raise DamagedEmbeddings(
            f"{where} is marked complete with {done} of {batches} batches done: it is damaged; "
            f"{fix}"
        )
    tied.check(where, fix, meta, arrays, flags, ends)
    return flags


def _positive(value: Any, whole: bool) -> bool:
    """Whether a recorded value is a number above 0 (whole, where `whole`), not a bool."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return value > 0 and np.isfinite(value) and (not whole or value == int(value))


def check_record(store: StoreLike, path: str, meta: dict[str, Any]) -> None:
    """Refuse (DamagedEmbeddings, one line naming the store, the attribute and its value) a
    group whose record of its tiles' grid is not what a run writes: the readers multiply and
    divide by these (footprints, strides, scales). Facts a group made before they were
    recorded lacks are not asked for."""
    grid = meta.get("grid")
    if grid is not None and not isinstance(grid, dict):
        _bad_record(store, path, "grid", grid, "a record of the tiles' grid")
    grid = grid or {}
    facts = {
        "tile_size": (meta.get("tile_size"), True),
        "read_px": (meta.get("read_px"), True),
        "mpp": (meta.get("mpp"), False),
        **{f"grid.{k}": (grid.get(k), True) for k in ("tile", "stride", "read", "read_stride")},
        **{f"grid.{k}": (grid.get(k), False) for k in ("mpp", "effective_mpp")},
    }
    for name, (value, whole) in facts.items():
        if value is not None and not _positive(value, whole):
            _bad_record(store, path, name, value, "a whole number above 0" if whole else
                        "a number above 0")  # fmt: skip
    down = grid.get("downsample")
    if down is not None and not (
        isinstance(down, list) and len(down) == 2 and all(_positive(d, False) for d in down)
    ):
        _bad_record(store, path, "grid.downsample", down, "two numbers above 0")


def _bad_record(store: StoreLike, path: str, name: str, value: Any, want: str) -> None:
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    raise DamagedEmbeddings(
        f"{store}: {path}'s record is damaged: its {name} is {shown}, not {want}; "
        f"{embed_again(path)}"
    )


def check_shapes(
    store: StoreLike,
    path: str,
    meta: dict[str, Any],
    arrays: dict[str, zarr.Array],
    fix: str = "",
) -> None:
    """Refuse (DamagedEmbeddings, one line naming the store, the array and the cause) a
    finished group (at `path`) whose arrays disagree with its record: features (tiles, the
    model's width), every per-tile column (tiles,), done a flag per batch, tokens and
    quality a row per tile."""
    where, fix = f"{store}: {path}", fix or embed_again(path)
    features = arrays.get("features")
    if features is None:
        raise DamagedEmbeddings(f"{where} has no features array; {fix}")
    tiles = int(meta.get("tiles", features.shape[0]))
    width = (meta.get("model") or {}).get("output_dim") or features.shape[-1]
    expected: dict[str, tuple[tuple[int, ...], str]] = {
        "features": ((tiles, int(width)), f"{tiles} tiles of {width} features"),
    }
    columns = (*COORDS, *(f"qc_{name}" for name in meta.get("qc_classes", [])))
    expected.update({key: ((tiles,), f"{tiles} tiles") for key in columns})
    if meta.get("batch_size"):
        batch = int(meta["batch_size"])
        expected["done"] = ((-(-tiles // batch),), f"{tiles} tiles in batches of {batch}")
    for key in ("tokens", "quality"):  # a row per tile, where the run stored them
        if key in arrays:
            shape = arrays[key].shape
            expected[key] = ((tiles, *shape[1:]), f"{tiles} tiles")
    stored_as, recorded = np.dtype(features.dtype), meta.get("dtype")
    if stored_as.kind != "f" or (recorded is not None and stored_as.name != recorded):
        raise DamagedEmbeddings(
            f"{where}/features is {stored_as.name} where the group records "
            f"{recorded or 'floating-point features'}: its zarr.json was changed; it is "
            f"damaged; {fix or embed_again(path)}"
        )
    for key, (shape, why) in expected.items():
        if key not in arrays and key in COORDS and not meta.get("complete"):
            continue  # an unfinished group made by an older version: resumed; read once whole
        if key not in arrays:
            raise DamagedEmbeddings(f"{where} has no {key} array; {fix}")
        if tuple(arrays[key].shape) != shape:
            raise DamagedEmbeddings(
                f"{where}/{key} has shape {tuple(arrays[key].shape)} where the group records "
                f"{why}, {shape}: it is damaged; {fix}"
            )


def non_finite_rows(values: np.ndarray) -> np.ndarray:
    """The indices of the rows of `values` (its first axis) holding a NaN or an infinity."""
    if all_finite(values):
        return np.empty(0, np.int64)
    return np.flatnonzero(~np.isfinite(values).reshape(len(values), -1).all(axis=1))


def all_finite(values: np.ndarray) -> bool:
    """Whether every value is finite, judged a block of rows at a time (the temporaries stay
    in the cache: 3x faster than over a slide's features at once). float16 is judged on its
    bits (an exponent of all ones: an infinity or a NaN): numpy's isfinite of float16 ran at
    0.8 GB/s, slower than reading the features, the bits at 5 GB/s."""
    if values.size == 0:
        return True
    rows = values.reshape(len(values), -1) if values.ndim else values.reshape(1, 1)
    step = max(1, 2**18 // rows.shape[1])  # rows of about 256 K values a block
    for start in range(0, len(rows), step):
        block = rows[start : start + step]
        if block.dtype == np.float16:
            if (block.view(np.uint16) & 0x7FFF).max() >= 0x7C00:
                return False
        elif not np.isfinite(block).all():
            return False
    return True


def check_rows(
    values: np.ndarray, where: str, fix: str, first: int = 0, unit: str = "tile row"
) -> np.ndarray:
    """`values` as they are, or DamagedEmbeddings naming `where` and the rows (numbered from
    `first`, the row of values[0] in its array) holding NaN or infinite values: every row of
    a finished group was written, by a run that writes only finite ones."""
    bad = non_finite_rows(values)
    if len(bad):
        shown = ", ".join(str(first + int(i)) for i in bad[:5]) + (", ..." if len(bad) > 5 else "")
        raise DamagedEmbeddings(
            f"{where} holds NaN or infinite values in {len(bad)} {unit}(s) ({shown}), which no "
            f"run writes: it is damaged; {fix}"
        )
    return values


def open_group(store: StoreLike, path: str) -> zarr.Group:
    """A group of the store: KeyError where `path` is absent, StoreError where it is damaged."""
    where = store if isinstance(store, Store) else Path(store)
    try:
        return zarr.open_group(where, path=path, mode="r", zarr_format=3, use_consolidated=False)
    except (FileNotFoundError, KeyError, zarr.errors.GroupNotFoundError) as exc:
        if path:
            raise KeyError(path) from exc
        raise StoreError(f"{store}: not a tilestore store ({exc})") from exc
    except DAMAGED as exc:
        what = path or "the store's root"
        raise StoreError(
            f"{store}: {what} is damaged ({type(exc).__name__}: {exc})"
            + (f"; embed the store again with overwrite=True (or remove {path})" if path else "")
        ) from exc


def slide_name(store: StoreLike) -> str:
    if isinstance(store, Store):
        _, record = open_store_group(store, complete=False)
        return Path(record.source.name or str(store)).stem
    name = Path(store).name
    return name[: -len(STORE_SUFFIX)] if name.endswith(STORE_SUFFIX) else name
