"""Damaged and odd inputs, as a hostile user or a bad disk hands them over: each one gives the
clean error of its kind naming the file and the cause, or a right result. Never a traceback
of another kind, a hang or a silent wrong answer. Inputs are made from the real files by
`tests.corpus`."""

from __future__ import annotations

import importlib
import json
import re
import warnings

import numpy as np
import pytest
import safetensors.torch
import timm

from tests import corpus as C
from tests.conftest import CMU, IHC, group_of
from tests.conftest import run_cli as _cli
from tilestore.conversion.converter import convert
from tilestore.conversion.info import describe
from tilestore.conversion.sidecar import open_in_place
from tilestore.embed import Embedder, Options
from tilestore.embed.models import ModelError, load_model
from tilestore.errors import (
    AnnotationError,
    ChunkError,
    SlideError,
    StoreError,
    TilestoreWarning,
)
from tilestore.plan import PlanOptions
from tilestore.plan.annotations import load_annotations
from tilestore.reading.opening import open_slide
from tilestore.reading.verify import verify_store

JPG = "stardist_histo.jpg"
DCM = "camelyon_lymphnode_jpeg.dcm"

# -- slide files: convert and info -------------------------------------------------------------

SLIDES = [
    (C.empty, r"file is empty \(0 bytes\)"),
    (C.text, r"not a supported slide .* file starts with b'patient '"),
    (C.truncated(100), r"truncated or corrupt"),
    (C.truncated(1_000_000), r"truncated or corrupt"),
    (C.truncated(-10), r"truncated or corrupt"),
    (C.directory, r"is a directory, not a slide file"),
    (C.fifo, r"not a regular file \(a pipe, socket or device\)"),
    (C.dangling, r"cannot read: No such file or directory"),
    (C.tiff_magic_garbage, r"truncated or corrupt: invalid offset to first page"),
    # checked on every page before tifffile sees them (its series detection divides by them)
    (C.tag("TileWidth", 0), r"page 0 declares 0x240 px tiles \(plausible: 1-16384"),
    (C.tag("TileLength", 65520), r"page 0 declares 240x65520 px tiles"),
    (C.tag("TileWidth", 65520), r"page 0 declares 65520x240 px tiles"),
    (C.tag("ImageWidth", 0), r"page 0 declares an image of 0x2967 px \(plausible: 1-500000"),
    (C.tag("ImageLength", 65535), r"holds 130 tiles or strips where .* need 2740"),
    (C.tile_damage("zeroed"), r"level 0 tile \(4, 0\) is damaged"),
    (C.tile_damage("no-soi"), r"level 0 tile \(4, 0\) is damaged"),
    (C.jpegtables_zeroed, r"cannot decode level 0 rows 0-\d+: Not a JPEG file"),
]


@pytest.mark.parametrize(("make", "cause"), SLIDES, ids=lambda v: getattr(v, "__name__", ""))
def test_a_bad_slide_is_one_slide_error_and_leaves_nothing(tmp_path, slide_path, make, cause):
    src = make(tmp_path, slide_path(CMU))
    out = tmp_path / "out"
    with pytest.raises(SlideError, match=rf"^{src}: .*{cause}"):
        convert(src, out)
    assert not out.exists() or not list(out.iterdir())  # no store, no partial folder


@pytest.mark.parametrize(
    "make",
    [C.tag("TileLength", 65520), C.fifo, C.tag("ImageLength", 65535)],
    ids=lambda v: v.__name__,
)
def test_info_on_a_bad_slide_is_the_same_error(tmp_path, slide_path, make):
    src = make(tmp_path, slide_path(CMU))
    with pytest.raises(SlideError, match=rf"^{src}: "):
        describe(src)


@pytest.mark.parametrize(
    ("make", "real"), [(C.jpeg_frame_size, JPG), (C.png_size, IHC)], ids=["jpeg", "png"]
)
def test_an_image_declaring_65500_px_a_side_is_refused_before_decoding(
    tmp_path, slide_path, make, real
):
    src = make(tmp_path, slide_path(real))
    with pytest.raises(SlideError, match=r"declares 65500x65500x3 \(12\.0 GiB decoded\) in a "):
        describe(src)


# A header declaring a size no image has (0 px tiles, strips of 0 rows, an image 0 px wide, a
# DICOM frame 0 px wide), in a level or an associated image: tifffile and wsidicom divide by
# these, and every command that opens a slide met a ZeroDivisionError ("internal error").
GEOMETRY = [
    (C.geometry("tiled", "TileWidth", 0), CMU, r"page 0 declares 0x240 px tiles"),
    (C.geometry("tiled", "ImageWidth", 0), CMU, r"page 0 declares an image of 0x700 px"),
    (C.geometry("striped", "RowsPerStrip", 0), CMU, r"page 0 declares strips of 0 rows"),
    (C.geometry("svs", "RowsPerStrip", 0, page=2), CMU, r"page 2 declares strips of 0 rows"),
    (C.dicom_attribute("Columns", 0), DCM, r"declares frames of 0x256 px \(Columns x Rows"),
]


# A DICOM WSI file without an attribute the standard requires of it (as pathml's exports
# come): wsidicom left it out, then said "Level files not found in provided files" or
# "Undetermined tile type", naming neither the file's fault nor the attribute.
@pytest.mark.parametrize(
    ("name", "what"),
    [
        ("TotalPixelMatrixColumns", "the whole image's width"),
        ("TotalPixelMatrixRows", "the whole image's height"),
        ("ImageType", "VOLUME, LABEL, OVERVIEW or THUMBNAIL"),
        ("DimensionOrganizationType", "how its frames tile the image"),
    ],
)
@pytest.mark.parametrize("command", ["info", "convert", "convert folder"])
def test_a_dicom_without_a_required_attribute_is_one_line_naming_it(
    tmp_path, slide_path, name, what, command
):
    src = C.dicom_without(name)(tmp_path, slide_path(DCM))
    if command == "convert folder":
        (tmp_path / "folder").mkdir()
        src = src.rename(tmp_path / "folder" / src.name)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with pytest.raises(SlideError) as refused:
            (describe if command == "info" else lambda s: convert(s, tmp_path / "out"))(
                src.parent if command == "convert folder" else src
            )
    assert str(refused.value) == (
        f"{src}: a DICOM whole-slide image file without {name} ({what}), which the standard "
        "requires: not a conformant DICOM WSI; export it again with a conformant tool (e.g. "
        "wsidicomizer)"
    )
    assert len({str(w.message) for w in said}) == len(said)  # no warning said twice
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


OPENS = {
    "convert": lambda src, out: convert(src, out),
    "convert keep_associated": lambda src, out: convert(src, out, keep_associated=True),
    "open_in_place": lambda src, out: open_in_place(src, out),
    "info": lambda src, out: describe(src),
    "info verify": lambda src, out: describe(src, verify=True),
}


@pytest.mark.parametrize("command", OPENS)
@pytest.mark.parametrize(
    ("make", "real", "cause"), GEOMETRY, ids=lambda v: getattr(v, "__name__", "")
)
def test_a_size_no_image_has_is_refused_by_every_command_that_opens_a_slide(
    tmp_path, slide_path, make, real, cause, command
):
    src = make(tmp_path, slide_path(real))
    out, before = tmp_path / "out", set(tmp_path.iterdir())
    with pytest.raises(
        SlideError, match=rf"^{re.escape(str(src))}: {cause}.* the header is corrupt$"
    ):
        OPENS[command](src, out)
    assert set(tmp_path.iterdir()) - before <= {out}  # no sidecar beside the slide
    assert not out.exists() or not list(out.iterdir())  # no store, no sidecar, no partial


def test_a_linked_slide_converts_as_its_target(tmp_path, slide_path, stores):
    store = convert(C.symlink(tmp_path, slide_path(CMU)), tmp_path / "out").store
    want = open_slide(stores(CMU)).read_region(0, 0, 480, 480, level=0)
    np.testing.assert_array_equal(open_slide(store).read_region(0, 0, 480, 480, level=0), want)


def test_a_bit_flipped_tile_is_copied_as_the_slide_has_it(tmp_path, slide_path):
    """Damage inside a tile's scan data is the slide's own: the store reproduces it exactly
    (as tifffile decodes it), it is not invented or hidden."""
    import tifffile

    src = C.tile_damage("bitflip")(tmp_path, slide_path(CMU))
    store = convert(src, tmp_path / "out").store
    with tifffile.TiffFile(src) as tif:
        want = tif.pages[0].asarray()[960:1200, :240]
    np.testing.assert_array_equal(open_slide(store).read_region(0, 960, 240, 240, level=0), want)


def test_info_says_it_read_metadata_only_and_verify_samples_tiles(tmp_path, slide_path):
    src = C.jpegtables_zeroed(tmp_path, slide_path(CMU))
    assert describe(src)["verified"] is False
    checked = describe(src, verify=True)["levels"][0]["checked"]
    assert checked["tiles"] == 8 and len(checked["bad"]) == 8
    assert checked["bad"][0].startswith("level 0 tile (0, 0): cannot decode")
    assert describe(slide_path(CMU), verify=True)["levels"][0]["checked"]["bad"] == []


# -- stores: reading, verifying, embedding -----------------------------------------------------

CHUNKS = [
    ("garbage", r"chunk is corrupt \(its CRC-32C does not match its bytes\)"),
    ("bitflip", r"chunk is corrupt"),
    ("empty", r"chunk is 0 bytes long \(truncated or empty\)"),
    ("truncated", r"chunk is corrupt"),
    ("missing", r"chunk is missing"),
]
# the file holding the chunk, its shard (the whole of CMU-1-Small-Region's level 0)
SHARDS = [
    ("symlink", r"shard is a symbolic link, not a file"),
    ("folder", r"shard is a folder"),
    ("fifo", r"shard is not a regular file"),
]


@pytest.mark.parametrize(("kind", "cause"), CHUNKS, ids=[k for k, _ in CHUNKS])
def test_a_damaged_chunk_is_named_when_read_and_when_verified(tmp_path, stores, kind, cause):
    store = C.damage_chunk(kind)(tmp_path, stores(CMU))
    slide = open_slide(store)
    where = rf"^{store.name}: level 0 chunk \(2, 3\): {cause}"
    with pytest.raises(ChunkError, match=where):
        slide.read_region(0, 0, 2220, 2967, level=0)
    assert slide.read_region(0, 0, 480, 480, level=0).shape == (480, 480, 3)  # the rest reads
    found = verify_store(store)
    assert len(found.bad) == 1 and "level 0 chunk (0, 2, 3): chunk " in found.bad[0]


@pytest.mark.parametrize(("kind", "cause"), SHARDS, ids=[k for k, _ in SHARDS])
def test_a_damaged_shard_is_named_once_when_read_and_when_verified(tmp_path, stores, kind, cause):
    store = C.damage_chunk(kind)(tmp_path, stores(CMU))
    slide = open_slide(store)
    where = rf"^{store.name}: level 0 shard \(0, 0, 0\): {cause}"
    with pytest.raises(ChunkError, match=where):
        slide.read_region(0, 0, 480, 480, level=0)
    assert slide.read_region(0, 0, 480, 480, level=1).shape == (480, 480, 3)  # others read
    found = verify_store(store)
    assert len(found.bad) == 1 and re_match(rf".*level 0 shard \(0, 0, 0\): {cause}", found.bad[0])


@pytest.fixture(scope="module")
def embedder():
    options = Options(device="cpu", batch_size=8, precision="fp32", dtype="float32")
    with Embedder("efficientnet-lite0", options) as loaded:
        yield loaded


@pytest.mark.parametrize(("kind", "cause"), CHUNKS[:5], ids=[k for k, _ in CHUNKS[:5]])
def test_embed_reports_a_damaged_chunk_and_goes_on(tmp_path, stores, embedder, kind, cause):
    bad = C.damage_chunk(kind)(tmp_path, stores(CMU))
    good = C.store_copy(tmp_path, stores(CMU), "good")
    plan = PlanOptions(mpp=0.5, tile=224)
    report = embedder.embed([bad, good], plan=plan)
    (failure,) = report.failures
    assert failure["store"] == str(bad)
    kept = r"\d+ of \d+ batches of .* are written and kept: rerun the same command to resume"
    gone = r"nothing was written: .* removed, the store is as it was"
    left = rf"\((?:{gone}|{kept})\)$"
    assert re_match(rf"^level 0 chunk \(2, 3\): {cause}.* {left}", failure["error"])
    if "removed" in failure["error"]:
        assert not (bad / "embeddings" / "efficientnet-lite0").exists()  # as before the run
    else:  # the batches before the damage are kept, and the group says it is unfinished
        group = bad / group_of(bad, "efficientnet-lite0")
        assert not json.loads((group / "zarr.json").read_text())["attributes"]["tilestore"][
            "complete"
        ]
    assert [s["store"] for s in report.slides if not s.get("failed")] == [str(good)]
    assert not list(tmp_path.glob(".*.lock"))


def re_match(pattern: str, text: str) -> bool:
    import re

    assert re.match(pattern, text), f"{text!r} does not match {pattern!r}"
    return True


STORE_META = [
    (C.corrupt_json(""), StoreError, r"cannot open store: "),
    (C.corrupt_json("0"), StoreError, r"store metadata is damaged \(JSONDecodeError"),
    (
        C.attrs_edit("no-levels", lambda a: a.pop("levels")),
        StoreError,
        r"tilestore attributes are damaged \(KeyError: 'levels'",
    ),
    (C.attrs_edit("no-complete", lambda a: a.pop("complete")), StoreError, r"incomplete store"),
    (
        C.attrs_edit("complete-false", lambda a: a.update(complete=False)),
        StoreError,
        r"incomplete store",
    ),
]


@pytest.mark.parametrize(
    ("make", "kind", "cause"), STORE_META, ids=lambda v: getattr(v, "__name__", "")
)
def test_damaged_store_metadata_is_a_store_error(tmp_path, stores, embedder, make, kind, cause):
    store = make(tmp_path, stores(CMU))
    with pytest.raises(kind, match=cause):
        open_slide(store)
    report = embedder.embed([store])
    assert re_match(rf".*{cause}", report.failures[0]["error"])


RESHARD = [
    (C.corrupt_json("1"), r"1/zarr.json is damaged \(JSONDecodeError: "),
    (C.corrupt_json("plans/default"), r"plans/default/zarr.json is damaged \(JSONDecodeError: "),
    (C.array_json("1", "no-codecs", lambda d: d.pop("codecs")), r"1/zarr.json is damaged "),
    (C.array_json("0", "shape-text", lambda d: d.update(shape="big")), r"0/zarr.json is damaged "),
    (
        C.attrs_edit("source-text", lambda a: a.update(source="x")),
        r"its tilestore attributes are damaged \(TypeError: ",
    ),
]


@pytest.fixture(scope="module")
def file_per_chunk(stores, tmp_path_factory):
    """CMU-1-Small-Region in one file per chunk (the layout before shards) with a plan: a
    copy of the session's store, which other tests read as it was made."""
    from tilestore.plan import plan_over_tissue, save_plan

    store = C.store_copy(tmp_path_factory.mktemp("reshard"), stores(CMU, shard="off"), "cmu")
    slide = open_slide(store)
    save_plan(slide, plan_over_tissue(slide, PlanOptions(mpp=1.0, tile=224, name="default")))
    return store


@pytest.mark.parametrize(("make", "cause"), RESHARD, ids=lambda v: getattr(v, "__name__", ""))
def test_reshard_of_a_damaged_document_is_one_store_error_and_changes_nothing(
    tmp_path, file_per_chunk, make, cause
):
    """Was `internal error (JSONDecodeError)`: every array's zarr.json is read (and checked as
    zarr reads it) before anything is written, inside the one place a damaged stored document
    becomes a StoreError (`tilestore.format.store.damage_as_store_error`)."""
    from tilestore.conversion import reshard

    store = make(tmp_path, file_per_chunk)
    before = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}
    with pytest.raises(
        StoreError, match=rf"^{re.escape(str(store))}: {cause}.*nothing was changed"
    ):
        reshard(store)
    assert {p: p.read_bytes() for p in store.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [store.name]  # nothing beside it
    run = _cli("reshard", store)
    assert run.returncode == 2
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith(f"tilestore: error: {store}: ") and "internal error" not in line


def test_info_on_a_damaged_level_is_a_store_error(tmp_path, stores):
    store = C.corrupt_json("0")(tmp_path, stores(CMU))
    with pytest.raises(StoreError, match=r"store metadata is damaged"):
        describe(store)


@pytest.mark.parametrize(
    "make",
    [
        C.attrs_edit("source-text", lambda a: a.update(source="x")),
        C.attrs_edit("size-text", lambda a: a["source"].update(size="big")),
    ],
    ids=lambda v: v.__name__,
)
def test_info_on_damaged_source_attributes_is_a_store_error(tmp_path, stores, make):
    """Was an AttributeError or TypeError: the source's facts were read outside
    `damage_as_store_error`."""
    store = make(tmp_path, stores(CMU))
    with pytest.raises(StoreError, match=r"tilestore attributes are damaged \((Type|Value)Error"):
        describe(store)


def test_info_says_an_incomplete_store_is_incomplete(tmp_path, stores):
    store = C.attrs_edit("no-complete", lambda a: a.pop("complete"))(tmp_path, stores(CMU))
    assert describe(store)["complete"] is False


def test_a_damaged_embeddings_chunk_is_named_when_read(tmp_path, stores, embedder):
    from tilestore import open_embeddings

    store = C.store_copy(tmp_path, stores(CMU), "embedded")
    embedder.embed([store], plan=PlanOptions(mpp=1.0, tile=224))
    chunk = store / group_of(store, "efficientnet-lite0") / "features" / "c" / "0" / "0"
    data = bytearray(chunk.read_bytes())
    data[7] ^= 0x10
    chunk.write_bytes(bytes(data))
    ds = open_embeddings(store, "efficientnet-lite0")
    with pytest.raises(ChunkError, match=r"embeddings/efficientnet-lite0/[^ :]+/features: damaged"):
        ds.features.compute()
    assert "features chunk (0, 0): chunk is corrupt" in verify_store(store).bad[0]


GROUP = "embeddings/efficientnet-lite0/1mpp-224px"  # embeddings/<model>/<plan>


def _grid(value):
    return lambda d: d["attributes"]["tilestore"].update(grid=value)


def _grid_part(key, value):
    return lambda d: d["attributes"]["tilestore"]["grid"].update({key: value})


# A finished group's documents edited: the features' data type (zarr then cannot parse the
# fill value; or, its fill value made to fit, reads garbage), its record of the tiles' grid.
# Each was an internal error (TypeError, AttributeError, IndexError) or a silent export.
DAMAGED_GROUPS = [
    (
        C.array_json(f"{GROUP}/features", "int16", lambda d: d.update(data_type="int16")),
        r"features/zarr\.json is not valid zarr metadata \(TypeError: Invalid type: NaN",
    ),
    (
        C.array_json(
            f"{GROUP}/features", "int16-fill0", lambda d: d.update(data_type="int16", fill_value=0)
        ),
        r"features is int16 where the group records float32: its zarr.json was changed",
    ),
    (C.array_json(GROUP, "grid-text", _grid("garbage")), r"its grid is 'garbage', not a record"),
    (C.array_json(GROUP, "grid-list", _grid([1, 2])), r"its grid is \[1, 2\], not a record"),
    (
        C.array_json(GROUP, "grid-down", _grid_part("downsample", "x")),
        r"its grid\.downsample is 'x', not two numbers above 0",
    ),
    (
        C.array_json(GROUP, "grid-read", _grid_part("read", -5)),
        r"its grid\.read is -5, not a whole number above 0",
    ),
    (
        C.array_json(GROUP, "grid-tile", _grid_part("tile", "abc")),
        r"its grid\.tile is 'abc', not a whole number above 0",
    ),
]


@pytest.fixture(scope="module")
def embedded(stores, embedder, tmp_path_factory):
    store = C.store_copy(tmp_path_factory.mktemp("embedded"), stores(CMU), "embedded")
    embedder.embed([store], plan=PlanOptions(mpp=1.0, tile=224))
    return store


@pytest.mark.parametrize(
    ("make", "cause"), DAMAGED_GROUPS, ids=lambda v: getattr(v, "__name__", "")
)
def test_a_damaged_group_record_is_one_line_naming_it_from_every_reader(
    tmp_path, embedded, make, cause
):
    from tilestore import open_embeddings
    from tilestore.errors import DamagedEmbeddings
    from tilestore.exports import cohort_to_h5

    store = make(tmp_path, embedded)
    said = rf"^{re.escape(str(store))}: {GROUP}.*{cause}.*; embed the store again"
    with pytest.raises(DamagedEmbeddings, match=said):
        open_embeddings(store, "efficientnet-lite0")
    with pytest.raises(DamagedEmbeddings, match=said):
        cohort_to_h5([store], "efficientnet-lite0", tmp_path / "h5")
    assert not (tmp_path / "h5").exists() or not list((tmp_path / "h5").iterdir())


def test_export_and_verify_of_a_features_type_changed_to_int16_are_one_line(tmp_path, embedded):
    store = DAMAGED_GROUPS[0][0](tmp_path, embedded)
    run = _cli("export", "h5", store, "-m", "efficientnet-lite0", "-o", tmp_path / "h5")
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert f"{store}: {GROUP}/features/zarr.json is not valid zarr metadata" in run.stderr
    with pytest.raises(StoreError, match=rf"^{re.escape(str(store))}: cannot list the store: "
                       rf"{GROUP}/features/zarr\.json is not valid zarr metadata"):  # fmt: skip
        verify_store(store)
    run = _cli("verify", store)
    assert run.returncode == 2 and "internal error" not in run.stderr, run.stderr
    assert run.stderr.count("\n") == 1 and f"{GROUP}/features/zarr.json" in run.stderr


# -- annotations --------------------------------------------------------------------------------


def _pts(*points: str) -> str:
    return "[" + ", ".join(points) + "]"


ANNOTATIONS = [
    (
        C.geojson("nan", C.polygon_geojson(_pts("[1, 1]", "[NaN, 1]", "[9, 9]", "[1, 1]"))),
        r"a coordinate is nan, not a finite number",
    ),
    (
        C.geojson("inf", C.polygon_geojson(_pts("[1, 1]", "[Infinity, 1]", "[9, 9]", "[1, 1]"))),
        r"a coordinate is inf, not a finite number",
    ),
    (
        C.geojson("text", C.polygon_geojson(_pts('["1", 1]', "[9, 1]", "[9, 9]", '["1", 1]'))),
        r"a coordinate is '1', not a number",
    ),
    (
        C.geojson("no-y", C.polygon_geojson(_pts("[1]", "[9, 1]", "[9, 9]", "[1]"))),
        r"a position holds 1 values, not 2 or 3",
    ),
    (
        C.geojson(
            "nested",
            '{"type": "Feature", "geometry": {"type": "Polygon", "coordinates": '
            + "[" * 100_000
            + "]" * 100_000
            + "}}",
        ),
        r"JSON nested too deeply to be annotations",
    ),
    (C.geojson("shallow", C.polygon_geojson("[[[[1, 1]]]]")), r"a position holds 1 values"),
    (
        C.geojson("two", C.polygon_geojson(_pts("[1, 1]", "[9, 1]"))),
        r"linearring requires at least 4 coordinates",
    ),
    (
        C.geojson("kind", '{"type": "Feature", "geometry": {"type": "Hex", "coordinates": []}}'),
        r"unknown geometry type 'Hex'",
    ),
    (C.geojson("cut", '{"type": "Feature", '), r"not valid JSON"),
    (C.geojson("features", '{"type": "FeatureCollection", "features": 5}'), r"is not a list"),
    (C.geojson("feature", '{"type": "FeatureCollection", "features": [5]}'), r"not a JSON object"),
    (C.geojson("empty", ""), r"not an annotation file"),
    (
        C.aperio("comma", C.vertices(C.SQUARE).replace('X="900"', 'X="900,5"', 1)),
        r"vertex 1 X is '900,5', not a number \(a decimal comma",
    ),
    (
        C.aperio("no-y", '<Vertex X="1"/><Vertex X="9" Y="1"/><Vertex X="9" Y="9"/>'),
        r"region 1 vertex 0 Y is missing",
    ),
    (
        C.aperio("nan", C.vertices(C.SQUARE).replace('X="900"', 'X="nan"', 1)),
        r"X is 'nan', not a finite number",
    ),
    (
        C.aperio("text", C.vertices(C.SQUARE).replace('X="900"', 'X="abc"', 1)),
        r"X is 'abc', not a number$",
    ),
    (
        C.asap("comma", '<Coordinate Order="0" X="1,5" Y="1"/><Coordinate Order="1" X="9" Y="1"/>'),
        r"coordinate X is '1,5', not a number \(a decimal comma",
    ),
    (
        C.asap("no-y", '<Coordinate Order="0" X="1"/><Coordinate Order="1" X="9" Y="1"/>'),
        r"coordinate Y is missing",
    ),
    (
        C.asap("order", '<Coordinate Order="a" X="1" Y="1"/><Coordinate Order="1" X="9" Y="1"/>'),
        r"coordinate Order is 'a', not a number",
    ),
]


@pytest.mark.parametrize(("make", "cause"), ANNOTATIONS, ids=lambda v: getattr(v, "__name__", ""))
def test_a_bad_annotation_is_one_annotation_error(tmp_path, make, cause):
    path = make(tmp_path)
    with pytest.raises(AnnotationError, match=rf"^{path}: .*{cause}"):
        load_annotations(path, size=(2000, 2000))


def test_an_xml_bomb_is_refused_unexpanded(tmp_path):
    bomb = tmp_path / "bomb.xml"
    lols = "".join(f'<!ENTITY l{i} "{"&l" + str(i - 1) + ";" * 10}">' for i in range(1, 9))
    bomb.write_text(f'<?xml version="1.0"?><!DOCTYPE a [<!ENTITY l0 "lol">{lols}]><a>&l8;</a>')
    with pytest.raises(AnnotationError, match=r"malformed XML|not an annotation|neither"):
        load_annotations(bomb)


# -- model checkpoints ------------------------------------------------------------------------


def _checkpoint(folder, config: dict, weights: bytes | None = None):
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    if weights is None:
        model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, depth=2)
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        safetensors.torch.save_file(state, folder / "model.safetensors")
    else:
        (folder / "model.safetensors").write_bytes(weights)
    return f"local:{folder}"


MODELS = [
    (
        {"architecture": "vit_small_patch16_224", "model_args": {"depth": 2}},
        None,
        r"weights do not fit the architecture \(size mismatch for cls_token",
    ),
    ({"architecture": "no_such_arch"}, None, r"cannot build no_such_arch"),
    (
        {"architecture": "vit_tiny_patch16_224", "model_args": {"depth": "two"}},
        None,
        r"cannot build vit_tiny_patch16_224",
    ),
    (
        {"architecture": "vit_tiny_patch16_224", "model_args": {"depth": 2}},
        b"\x00" * 20,
        r"cannot read weights .* safely",
    ),
    ({"model_args": {}}, None, r"is not a timm config \(no 'architecture'\)"),
]


@pytest.mark.parametrize(("config", "weights", "cause"), MODELS)
def test_a_bad_checkpoint_is_one_model_error(tmp_path, config, weights, cause):
    with pytest.raises(ModelError, match=cause):
        load_model(_checkpoint(tmp_path / "model", config, weights))


# -- leftovers of killed conversions -----------------------------------------------------------


def test_partial_folders_of_dead_conversions_are_removed_and_others_reported(tmp_path, slide_path):
    out = tmp_path / "out"
    out.mkdir()
    host = importlib.import_module("tilestore.format.leftovers")._host()
    dead = out / f".CMU-1-Small-Region.ome.zarr.partial.{host}.999999999.0123abcd"
    other = out / ".CMU-1-Small-Region.ome.zarr.partial.elsewhere.12.0123abcd"
    for folder in (dead, other):
        (folder / "0").mkdir(parents=True)
        (folder / "0" / "x").write_bytes(b"x" * 1000)
    with pytest.warns(TilestoreWarning) as notes:
        convert(slide_path(CMU), out)
    said = " ".join(str(n.message) for n in notes)
    assert "removed" in said and "killed" in said and "left" in said and "another host" in said
    assert not dead.exists() and other.exists()


def test_a_store_renamed_aside_by_a_killed_replacement_is_put_back(tmp_path, slide_path):
    out = tmp_path / "out"
    store = convert(slide_path(CMU), out).store
    aside = out / f".{store.name}.replaced.0123abcd"
    store.rename(aside)  # killed after moving the old store aside, before the new arrived
    with (
        pytest.warns(TilestoreWarning, match="restored"),
        pytest.raises(StoreError, match="exists"),
    ):
        convert(slide_path(CMU), out)  # no overwrite: the restored store is refused, not lost
    assert open_slide(store).shape == (3, 2967, 2220) and not aside.exists()


# -- the command: one line, exit code 2 ----------------------------------------------------------


NAN_ROI = C.geojson("nan", C.polygon_geojson(_pts("[1, 1]", "[NaN, 1]", "[9, 9]", "[1, 1]")))


def test_the_command_prints_one_line_and_exits_2(tmp_path, slide_path, stores):
    fifo = C.fifo(tmp_path, slide_path(CMU))
    bad = C.damage_chunk("garbage")(tmp_path, stores(CMU))
    cases = [
        (("convert", fifo, "-o", tmp_path / "o"), "not a regular file"),
        (("info", C.corrupt_json("0")(tmp_path, stores(CMU))), "store metadata is damaged"),
        (("verify", bad), "level 0 chunk (0, 2, 3)"),
        (("plan", bad, "--roi", NAN_ROI(tmp_path)), "a coordinate is nan, not a finite number"),
    ]
    for args, cause in cases:
        run = _cli(*args)
        lines = run.stderr.strip().splitlines()
        assert run.returncode == 2, (args, run.stderr)
        assert (
            len(lines) == 1
            and lines[0].startswith("tilestore: error: ")
            and "Traceback" not in run.stderr
        )
        assert cause in lines[0], lines[0]
    run = _cli("--debug", "info", C.corrupt_json("0")(tmp_path / "d", stores(CMU)))
    assert "Traceback" in run.stderr  # with --debug, the traceback for a bug report


@pytest.mark.parametrize(
    ("make", "cause"),
    [
        (C.geometry("tiled", "TileWidth", 0), "page 0 declares 0x240 px tiles"),
        (C.geometry("striped", "RowsPerStrip", 0), "page 0 declares strips of 0 rows"),
    ],
    ids=["tile-0", "strips-0"],
)
def test_a_size_no_image_has_is_one_line_from_every_command(tmp_path, slide_path, make, cause):
    """Was `tilestore: error: internal error (ZeroDivisionError)` (strips of 0 rows: info
    --verify and convert; an image 0 px wide: every command)."""
    src = make(tmp_path, slide_path(CMU))
    out = tmp_path / "out"
    for args in (
        ("convert", src, "-o", out),
        ("convert", src, "-o", out, "--in-place"),
        ("info", src),
        ("info", src, "--verify"),
    ):
        run = _cli(*args)
        assert run.returncode == 2, (args, run.stderr)
        assert run.stderr.strip().splitlines() == [
            f"tilestore: error: {src}: {cause} (plausible: "
            + run.stderr.split("(plausible: ", 1)[1].strip()
        ]
        assert run.stderr.strip().endswith("; the header is corrupt")
    assert not out.exists() or not list(out.iterdir())


def test_info_verify_on_a_damaged_slide_exits_2(tmp_path, slide_path):
    """Damage found is the check's failure: the table says which tiles, and one line on
    stderr with exit 2 says so, as `verify` does of a store."""
    src = C.jpegtables_zeroed(tmp_path, slide_path(CMU))
    run = _cli("info", src, "--verify")
    assert run.returncode == 2
    assert "8 do not decode" in " ".join(run.stdout.split())
    assert run.stderr.strip().splitlines() == [
        f"tilestore: error: {src}: 8 of 8 sampled tiles do not decode (first: level 0 tile "
        f"(0, 0): {run.stderr.split('(0, 0): ', 1)[1].strip()}"
    ]
    assert _cli("info", src, "--verify", "--json").returncode == 2
    assert _cli("info", slide_path(CMU), "--verify").returncode == 0


def test_a_tile_damaged_in_its_headers_fails_convert_in_one_line(tmp_path, slide_path):
    """A bit flipped in a source tile's JPEG headers (a segment length past the tile's end):
    its markers do not parse, so it is not copied as it is; decoding it fails too; convert
    names the file, the tile and both causes (exit 2), and leaves nothing that looks like a
    store."""
    src = C.tile_damage("header-bitflip")(tmp_path, slide_path(CMU))
    run = _cli("convert", src, "-o", tmp_path / "out")
    assert run.returncode == 2
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith(
        f"tilestore: error: {src}: level 0 tile (4, 0) is damaged: corrupt JPEG segment at byte "
    )
    assert "; decoding it: " in line and "internal error" not in line
    assert not list((tmp_path / "out").glob("*.ome.zarr"))


# A chain of image headers that comes back on itself: tifffile walks it a page at a time and
# looks for loops only at 100 pages, so `info` and `convert` iterated forever. Run as the user
# runs them, in a process of their own, so that a hang fails the test instead of stopping it.
@pytest.mark.parametrize("command", ["info", "convert"])
@pytest.mark.parametrize(
    ("make", "cause"),
    [
        (C.page_loop(back_to=0, at=0), r"page 0's next-page offset points back to page 0"),
        (C.page_loop(back_to=1, at=2), r"page 2's next-page offset points back to page 1"),
    ],
    ids=["self", "back"],
)
def test_a_loop_in_the_page_chain_is_refused_in_one_line(
    tmp_path, slide_path, make, cause, command
):
    src = make(tmp_path, slide_path(CMU))
    out = tmp_path / "out"
    args = ("info", src) if command == "info" else ("convert", src, "-o", out)
    run = _cli(*args, timeout=300)
    assert run.returncode == 2, run.stderr
    assert re.fullmatch(
        rf"tilestore: error: {re.escape(str(src))}: a loop in the file's page chain: {cause} "
        r"\(byte \d+\); the header is corrupt",
        run.stderr.strip(),
    ), run.stderr
    assert not out.exists() or not list(out.iterdir())


@pytest.fixture
def read_only(tmp_path):
    """A folder bound read-only onto another (an archive's mount), unbound after the test."""
    folder, under = tmp_path / "ro", tmp_path / "under"
    folder.mkdir()
    under.mkdir()
    import subprocess

    bound = subprocess.run(["mount", "--bind", str(under), str(folder)], capture_output=True)
    if bound.returncode:
        pytest.skip(f"cannot bind-mount here: {bound.stderr.decode().strip()}")
    subprocess.run(["mount", "-o", "remount,ro,bind", str(folder)], check=True)
    yield folder, under
    subprocess.run(["umount", "-l", str(folder)], check=False)


def test_writing_into_a_read_only_store_names_the_store(read_only, stores):
    """It said "tilestore: error: <store>/labels: Read-only file system" (or "zarr.json: ..."),
    the file it failed on and not the store or what to do."""
    folder, under = read_only
    C.store_copy(under, stores(CMU), "cmu")
    store = folder / "cmu.ome.zarr"
    run = _cli("tissue", store)
    assert run.returncode == 2, run.stderr
    assert run.stderr == (
        f"tilestore: error: {store}: cannot write into the store (it is on a read-only file "
        "system); nothing was written: run this on a writable copy of the store\n"
    )
    with pytest.raises(StoreError, match=rf"^{re.escape(str(store))}: cannot write into"):
        open_slide(store).writable_group()
