"""What a store says about itself is one typed record (`tilestore.format.record`): read and
checked where a store is opened, written by the converter, verify and reshard, asked by
every reader; no other module looks a key up in the raw attributes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import zarr

from tests.conftest import CMU, NDPI, REPO
from tilestore.errors import StoreError
from tilestore.format.record import ATTRS_KEY, StoreRecord
from tilestore.format.store import open_group, write_record
from tilestore.reading import open_slide


def _raw(store: Path) -> dict:
    return json.loads((store / "zarr.json").read_text())["attributes"][ATTRS_KEY]


@pytest.mark.parametrize("slide", [CMU, NDPI])
def test_a_converted_stores_record_says_what_its_attributes_say(stores, slide):
    store = stores(slide)
    raw = _raw(store)
    _, record = open_group(store)
    assert record.to_attrs() == raw  # every key, in its place: nothing lost on the way
    assert list(record.to_attrs())[-1] == "complete"  # written last
    opened = open_slide(store)
    assert opened.record == record
    assert [lv.path for lv in record.levels] == [lv.path for lv in opened.levels]
    assert record.channels == tuple(raw["channels"]) and record.rgb == raw["rgb"]
    assert record.fluorescence == (slide == NDPI)
    assert record.integrity.every_chunk and record.integrity.checksum == "crc32c"


def test_a_fact_the_record_does_not_name_is_kept_as_written(store):
    path = store()
    group = zarr.open_group(path, mode="r+")
    attrs = dict(group.attrs[ATTRS_KEY])
    attrs["made_by_a_newer_version"] = {"anything": [1, 2]}
    group.attrs[ATTRS_KEY] = attrs
    _, record = open_group(path)
    assert record.get("made_by_a_newer_version") == {"anything": [1, 2]}
    write_record(zarr.open_group(path, mode="r+"), record.replace(verified={"at": "now"}))
    again = _raw(path)
    assert again["made_by_a_newer_version"] == {"anything": [1, 2]}
    assert again["verified"] == {"at": "now"} and list(again)[-1] == "complete"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("levels", "0"),
        ("channels", 3),
        ("mpp", {"x": "wide"}),
        ("source", [1]),
        ("background", "x"),
    ],
)
def test_a_record_of_the_wrong_types_is_one_store_error(store, key, value):
    path = store()
    group = zarr.open_group(path, mode="r+")
    attrs = dict(group.attrs[ATTRS_KEY])
    attrs[key] = value
    group.attrs[ATTRS_KEY] = attrs
    with pytest.raises(StoreError, match=r"its tilestore attributes are damaged") as refused:
        open_slide(path)
    assert str(path) in str(refused.value) and "\n" not in str(refused.value)


# The record's key looked up or written as a literal: attrs["tilestore"], attrs.get("tilestore"),
# a {"tilestore": ...} of attributes; the name ATTRS_KEY anywhere.
RAW_KEY = re.compile(
    r"""\bATTRS_KEY\b|attrs\s*\[\s*["']tilestore["']|\.(?:get|pop|setdefault)\(\s*["']tilestore["']"""
    r"""|["']tilestore["']\s*:"""
)
# {"tilestore": ...} where it is not a store's record: an AnnData file's uns (`h5ad`)
NOT_A_RECORD = {"tilestore/exports/h5ad.py": 1}


def raw_lookups(root: Path) -> dict[str, int]:
    """{file: lines naming the record's key raw} in the package's folders below `root`,
    outside the format layer (`tilestore/format`, where the records are)."""
    found: dict[str, int] = {}
    for folder in ("tilestore", "embed", "cli"):
        for path in sorted((root / folder).rglob("*.py")):
            name = str(path.relative_to(root))
            if name.startswith("tilestore/format/"):
                continue
            hits = sum(1 for line in path.read_text().splitlines() if RAW_KEY.search(line))
            if hits:
                found[name] = hits
    return found


def test_no_module_but_the_format_looks_into_the_raw_record():
    """The record's key is named in the format layer only: readers and writers of every
    group's record (plans, embeddings groups, slide vectors, scores, labels, tile sums) go
    through `tilestore.format.records`, by name or by the literal key."""
    assert raw_lookups(REPO) == NOT_A_RECORD


def test_the_guard_sees_each_way_of_writing_the_key(tmp_path):
    """Each form the guard looks for is found (so the guard above fails where one is used)."""
    forms = [
        'meta = group.attrs["tilestore"]',
        "meta = group.attrs.get('tilestore', {})",
        'group.attrs["tilestore"] = facts',
        'zarr.create_array(store, attributes={"tilestore": facts})',
        "key = ATTRS_KEY",
    ]
    (tmp_path / "tilestore").mkdir()
    for i, form in enumerate(forms):
        (tmp_path / "tilestore" / f"m{i}.py").write_text(
            f"{form}\nlogger = getLogger('tilestore')\n"
        )
    assert raw_lookups(tmp_path) == {f"tilestore/m{i}.py": 1 for i in range(len(forms))}


def test_the_record_is_what_a_store_is_opened_with(stores):
    _, record = open_group(stores(CMU))
    assert isinstance(record, StoreRecord)
