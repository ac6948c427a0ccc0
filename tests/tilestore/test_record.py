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


def test_no_module_but_the_format_looks_into_the_raw_record():
    """The record's key is named in the format layer only: readers ask the record."""
    users = []
    for folder in ("tilestore", "embed", "cli"):
        for path in (REPO / folder).rglob("*.py"):
            if re.search(r"\bATTRS_KEY\b", path.read_text()):
                users.append(str(path.relative_to(REPO)))
    assert sorted(users) == ["tilestore/format/__init__.py", "tilestore/format/record.py",
                             "tilestore/format/store.py"]  # fmt: skip


def test_the_record_is_what_a_store_is_opened_with(stores):
    _, record = open_group(stores(CMU))
    assert isinstance(record, StoreRecord)
