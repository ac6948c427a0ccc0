"""`describe`: stores and slide files explain themselves."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import CMU, NDPI
from tilestore.conversion.info import describe
from tilestore.errors import StoreError


def test_store_description(stores):
    desc = describe(stores(CMU))
    assert desc["kind"] == "store" and desc["complete"]
    assert desc["source"]["name"] == CMU and len(desc["source"]["sha256"]) == 64
    assert [lv["write"] for lv in desc["levels"]] == ["copy", "re-encode", "re-encode"]
    assert [lv["lossy"] for lv in desc["levels"]] == [False, True, True]
    assert desc["levels"][0]["psnr"] is None and desc["levels"][1]["psnr"] > 38
    assert desc["levels"][0]["codecs"] == ["transpose", "imagecodecs_jpeg", "crc32c"]
    assert desc["levels"][0]["chunks"] == [3, 240, 240]
    assert desc["levels"][0]["shards"] == [3, 240 * 13, 240 * 10]  # the whole level: 13 x 10
    assert desc["levels"][1]["mpp"] == pytest.approx([0.998, 0.998])
    assert desc["size_vs_source"] == pytest.approx(
        desc["size_bytes"] / desc["source"]["size"], rel=1e-3
    )
    json.dumps(desc)


def test_incomplete_store_is_described_not_refused(tmp_path, stores):
    copy = tmp_path / "x.ome.zarr"
    shutil.copytree(stores(NDPI), copy)
    meta = json.loads((copy / "zarr.json").read_text())
    del meta["attributes"]["tilestore"]["complete"]
    (copy / "zarr.json").write_text(json.dumps(meta))
    assert describe(copy)["complete"] is False


def test_slide_description(slide_path):
    desc = describe(slide_path(NDPI))
    assert desc["kind"] == "slide" and desc["format"] == "ndpi"
    assert len(desc["levels"]) == 4 and not desc["levels"][0]["copyable"]
    assert desc["modality"]["value"] == "fluorescence"
    cmu = describe(slide_path(CMU))
    assert cmu["levels"][0]["copyable"]
    assert cmu["levels"][0]["lossless"] == {"value": False, "origin": "TIFF Compression 7 (JPEG)"}
    assert cmu["codec"]["reason"] == "8-bit RGB brightfield stored lossy: TIFF Compression 7 (JPEG)"


def test_plain_directory_is_refused(tmp_path):
    with pytest.raises(StoreError, match="neither a store nor a slide"):
        describe(tmp_path)
