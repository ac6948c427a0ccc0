"""The viewer's server over real embedded stores: chunks served as stored, overlays drawn
from what the stores hold, per-tile values and the similarity search, hostile URLs, and a
store left exactly as it was."""

from __future__ import annotations

import io
import json
import os
import shutil
from urllib.parse import quote

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from starlette.testclient import TestClient

from tests.conftest import CMU
from tests.corpus import EMBEDDINGS_DAMAGE, damage_embeddings
from tilestore.errors import ViewError
from tilestore.format.jpeg import marker_facts, read_header
from tilestore.plan import load_plan
from tilestore.reading.opening import open_slide
from tilestore.view import Catalog, make_app
from tilestore.view.overlays import REASONS, plan_reasons
from tilestore.view.tiles import as_browser_reads, tile
from tilestore.view.values import nearest, similarity, tile_at

MODEL = "efficientnet-lite0"


def listing(path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(path.rglob("*"))
    }


@pytest.fixture(scope="module")
def catalog(embedded_cohort):
    slides = [open_slide(p) for p in embedded_cohort]
    return Catalog(slides, [str(p) for p in embedded_cohort], [str(p) for p in embedded_cohort])


@pytest.fixture(scope="module")
def client(catalog):
    return TestClient(make_app(catalog))


def png(response) -> np.ndarray:
    assert response.status_code == 200 and response.headers["content-type"] == "image/png"
    return np.asarray(Image.open(io.BytesIO(response.content)).convert("RGBA"))


def test_slides_list_their_levels_and_layers(client, embedded_cohort):
    slides = client.get("/api/slides").json()
    assert [s["name"] for s in slides] == [p.name for p in embedded_cohort]
    cmu = slides[0]
    assert (cmu["width"], cmu["height"]) == (2220, 2967)
    assert cmu["levels"][0] == {"width": 2220, "height": 2967, "downsample": [1.0, 1.0],
                                "tile": [240, 240]}  # fmt: skip
    assert cmu["layers"]["tissue"] and cmu["layers"]["plans"] == ["classes"]
    assert list(cmu["layers"]["models"]) == [MODEL]
    assert cmu["layers"]["models"][MODEL]["dim"] == 1280


def test_a_copied_chunk_is_served_byte_for_byte(client, catalog):
    slide = catalog.get(0).slide
    for level, (row, col) in [(0, (0, 0)), (0, (12, 9)), (1, (3, 2))]:
        stored = slide.chunks(level).fetch_one((row, col))
        got = client.get(f"/tiles/0/{level}/{col}/{row}")
        assert got.status_code == 200 and got.headers["content-type"] == "image/jpeg"
        assert got.content == stored  # level 0: Aperio's own tile, as copied
        # what a browser's decoder infers from the stream is what the level declares
        assert read_header(got.content).color_space == slide.chunks(level).color_space
        decoded = np.asarray(Image.open(io.BytesIO(got.content)).convert("RGB"))
        want = slide.chunks(level).load([(row, col)])[0]
        assert np.abs(decoded.astype(int) - want.astype(int)).mean() < 1.5  # PIL vs libjpeg


def test_an_rgb_coded_chunk_without_its_marker_is_marked_for_the_browser(catalog):
    stored = catalog.get(0).slide.chunks(0).fetch_one((0, 0))
    bare = stored.replace(b"\xff\xee\x00\x0eAdobe\x00\x64\x00\x00\x00\x00\x00", b"", 1)
    assert marker_facts(bare)[1] is None
    marked = as_browser_reads(bare, "rgb")
    assert marker_facts(marked)[1] == 0
    assert as_browser_reads(stored, "rgb") is stored  # already right: the same bytes
    assert as_browser_reads(stored, "ycbcr") is None  # marked RGB, declared YCbCr: re-encoded


def test_a_zstd_level_is_decoded_and_encoded(stores, slide_path):
    ihc = open_slide(stores("skimage_ihc.png", mpp=0.5, codec="zstd"))
    assert not ihc.chunks(0).is_jpeg
    got = tile(ihc, 0, 0, 0)
    assert not got.copied and got.media_type == "image/jpeg"
    decoded = np.asarray(Image.open(io.BytesIO(got.data)).convert("RGB"))
    want = ihc.chunks(0).load([(0, 0)])[0]
    assert decoded.shape == want.shape
    assert np.abs(decoded.astype(int) - want.astype(int)).mean() < 3  # JPEG at quality 90


def test_the_tissue_overlay_is_the_stored_mask(client, catalog):
    from tilestore.masks.tissue import read_tissue

    facts = client.get("/api/overlay/0?kind=tissue").json()
    mask = read_tissue(catalog.get(0).slide)
    image = png(client.get(facts["url"]))
    assert ((image[..., 3] > 0) == mask.mask).all()
    assert facts["extent"] == [mask.mask.shape[1] * mask.downsample[1],
                               mask.mask.shape[0] * mask.downsample[0]]  # fmt: skip
    assert facts["legend"]["items"][0]["count"] == int(mask.mask.sum())


def test_the_plan_overlay_shows_kept_cells_and_why_others_are_not(client, catalog):
    slide = catalog.get(0).slide
    plan, _ = load_plan(slide, "classes")
    reasons = plan_reasons(slide, plan)
    kept = np.argwhere(reasons == list(REASONS).index("kept"))
    assert sorted(map(tuple, kept)) == sorted(zip(plan.row, plan.col, strict=True))
    # with the plan's default min_tissue, every other tissue cell holds too little tissue
    assert set(np.unique(reasons)) <= {-1, 0, 1}
    facts = client.get("/api/overlay/0?kind=plan&plan=classes").json()
    counts = {i["name"]: i["count"] for i in facts["legend"]["items"]}
    assert counts["kept"] == len(plan)
    image = png(client.get(facts["url"]))
    rows, cols = plan.spec.grid
    cell_h, cell_w = image.shape[0] // rows, image.shape[1] // cols
    r, c = int(plan.row[0]), int(plan.col[0])
    assert tuple(image[r * cell_h + cell_h // 2, c * cell_w + cell_w // 2]) == REASONS["kept"]


def test_columns_pca_and_clusters_are_drawn_per_tile(client, catalog):
    columns = client.get(f"/api/columns?model={MODEL}").json()["columns"]
    assert columns[:3] == ["pca", "clusters", "similarity"] and "tissue" in columns
    n = catalog.embedded(MODEL).tiles_of(0).stop
    clusters = client.get(f"/api/overlay/0?kind=tiles&model={MODEL}&column=clusters&k=4").json()
    assert sum(i["count"] for i in clusters["legend"]["items"]) == n
    tissue = client.get(f"/api/overlay/0?kind=tiles&model={MODEL}&column=tissue").json()
    assert tissue["legend"]["kind"] == "scale" and 0 <= tissue["legend"]["min"] <= 1
    assert png(client.get(tissue["url"]))[..., 3].any()
    missing = client.get(f"/api/overlay/0?kind=tiles&model={MODEL}&column=nope")
    assert missing.status_code == 404 and "no per-tile column 'nope'" in missing.json()["error"]


@pytest.mark.parametrize("k", [3_000_000, 1, 21])
def test_a_cluster_count_out_of_2_to_20_is_refused_before_any_colour_is_made(
    client, monkeypatch, k
):
    """k=3,000,000 took 208 s and 774 MB of colours before the 2-20 check refused it."""
    import tilestore.analysis.plots as plots

    asked = []
    monkeypatch.setattr(
        plots, "cluster_colors", lambda n: asked.append(n) or plots.np.zeros((n, 3))
    )
    got = client.get(f"/api/overlay/0?kind=tiles&model={MODEL}&column=clusters&k={k}")
    assert got.status_code == 404 and got.json()["error"] == f"clusters: k={k}; ask for 2 to 20"
    assert asked == []


def test_similarity_is_the_cosine_of_stored_features(catalog):
    ds = catalog.embedded(MODEL).ds
    features = np.asarray(ds["features"].values, np.float64)
    ref = 7
    want = (
        features
        @ features[ref]
        / (np.linalg.norm(features, axis=1) * np.linalg.norm(features[ref]))
    )
    np.testing.assert_allclose(similarity(catalog, MODEL, ref), want, rtol=1e-5, atol=1e-6)
    hits = nearest(catalog, MODEL, ref, 5)
    assert ref not in [t for t, _, _ in hits] and len(hits) == 5
    assert [s for _, _, s in hits] == sorted((s for _, _, s in hits), reverse=True)
    assert hits[0][2] == pytest.approx(np.sort(np.delete(want, ref))[-1], rel=1e-5)
    slides = {slide for _, slide, _ in nearest(catalog, MODEL, ref, len(features))}
    assert slides == {0, 1}  # across both slides opened
    assert {s for _, s, _ in nearest(catalog, MODEL, ref, 50, within=1)} == {1}


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_tile_under_a_point_holds_the_point(catalog, data):
    embedded = catalog.embedded(MODEL)
    part = embedded.tiles_of(0)
    ds = embedded.ds.isel(tile=part)
    meta = embedded.ds.attrs["slides"][0]
    fh, fw = meta["footprint0"]
    i = data.draw(st.integers(0, part.stop - 1))
    x = float(ds["x"][i]) + data.draw(st.floats(0, fw - 1e-6))  # (not rounded onto the edge)
    y = float(ds["y"][i]) + data.draw(st.floats(0, fh - 1e-6))
    found = tile_at(catalog, MODEL, 0, x, y)
    fx, fy = float(embedded.ds["x"][found]), float(embedded.ds["y"][found])
    assert fx <= x < fx + fw and fy <= y < fy + fh


def test_a_click_gives_the_nearest_tiles_and_a_similarity_overlay(client, catalog):
    ds = catalog.embedded(MODEL).ds
    x, y = float(ds["x"][3]) + 10, float(ds["y"][3]) + 10
    found = client.get(f"/api/similar/0?model={MODEL}&x={x}&y={y}&k=6").json()
    assert found["ref"]["tile"] == 3 and len(found["hits"]) == 6
    thumb = client.get(found["hits"][0]["thumb"])
    assert thumb.headers["content-type"] == "image/jpeg"
    assert max(Image.open(io.BytesIO(thumb.content)).size) == 128
    facts = client.get(f"/api/overlay/0?kind=tiles&model={MODEL}&column=similarity&ref=3").json()
    assert facts["legend"]["max"] == 1.0 and "tile 3" in facts["legend"]["label"]
    glass = client.get(f"/api/similar/0?model={MODEL}&x=1&y=1")  # no tile there
    assert glass.status_code == 404 and "no efficientnet-lite0 tile at (1, 1)" in glass.text


def test_the_store_is_left_as_it_was(embedded_cohort, client):
    before = [listing(p) for p in embedded_cohort]
    for url in ["/api/slides", "/tiles/0/0/1/1", "/api/overlay/0?kind=tissue",
                f"/api/overlay/1?kind=tiles&model={MODEL}&column=pca",
                f"/api/similar/1?model={MODEL}&tile=0"]:  # fmt: skip
        assert client.get(url).status_code == 200
    assert [listing(p) for p in embedded_cohort] == before


# Each hostile request and what it gets: nothing outside the stores and the page's own files.
HOSTILE = [
    ("/static/../catalog.py", 404),
    ("/static/%2e%2e/catalog.py", 404),
    ("/static/..%2fcatalog.py", 404),
    ("/static/%2e%2e%2f%2e%2e%2fconftest.py", 404),
    ("/static//etc/passwd", 404),
    ("/static/" + quote("/etc/passwd", safe=""), 404),
    ("/../../etc/passwd", 404),
    ("/tiles/0/0/../../../etc/passwd", 404),
    ("/tiles/0/0/-1/0", 404),
    ("/tiles/0/9/0/0", 404),
    ("/tiles/7/0/0/0", 404),
    ("/tiles/0/0/0/99999999999999999999", 404),
    ("/tiles/x/0/0/0", 404),
    ("/overlay/0.png?kind=plan&plan=../../zarr.json", 404),
    ("/overlay/0.png?kind=tiles&model=../../etc&column=pca", 404),
    ("/api/similar/0?model=" + MODEL + "&x=nan&y=1", 404),
    ("/api/similar/0?model=" + MODEL + "&tile=-5", 404),
    ("/thumb/0.jpg?model=" + MODEL + "&tile=10000000", 404),
    ("/embeddings/efficientnet-lite0/features/c/0/0", 404),
    ("/zarr.json", 404),
]


@pytest.mark.parametrize(("url", "status"), HOSTILE)
def test_hostile_urls_get_nothing_outside_the_stores(client, url, status):
    got = client.get(url)
    assert got.status_code == status, (url, got.status_code, got.text[:200])
    assert b"root:" not in got.content and b"import" not in got.content
    assert b'"zarr_format"' not in got.content


def test_only_get_is_answered(client):
    for method in ("post", "put", "delete", "patch"):
        assert getattr(client, method)("/api/slides").status_code == 405


def test_a_linked_chunk_in_the_store_is_refused_not_served(store, tmp_path):
    path = store()
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"root:x:0:0:secret")
    shard = next((path / "0" / "c").rglob("*"))
    shard = next(p for p in (path / "0" / "c").rglob("*") if p.is_file())
    shard.unlink()
    os.symlink(outside, shard)
    slide = open_slide(path)
    client = TestClient(make_app(Catalog([slide], [str(path)], [str(path)])))
    got = client.get("/tiles/0/0/0/0")
    assert got.status_code == 500 and b"secret" not in got.content
    assert "chunk" in got.json()["error"] or "link" in got.json()["error"]


@pytest.mark.parametrize("kind", EMBEDDINGS_DAMAGE)
def test_damaged_embeddings_are_a_json_error_naming_the_cause_not_a_404(
    embedded_cohort, tmp_path, kind
):
    """NaN or infinite features, or features' zarr.json edited to fewer rows than the group
    records: the PCA, the clusters and a similarity search say so, 500 (the embeddings are
    there, and damaged), where they answered scikit-learn's "Input X contains NaN." or
    xarray's "conflicting sizes" (400)."""
    path = tmp_path / embedded_cohort[0].name
    shutil.copytree(embedded_cohort[0], path)
    said = damage_embeddings(path, MODEL, kind)
    client = TestClient(make_app(Catalog([open_slide(path)], [str(path)], [str(path)])))
    for url in (f"/api/overlay/0?kind=tiles&model={MODEL}&column=pca",
                f"/api/overlay/0?kind=tiles&model={MODEL}&column=clusters&k=4",
                f"/api/similar/0?model={MODEL}&tile=0"):  # fmt: skip
        got = client.get(url)
        assert got.status_code == 500, (url, got.status_code, got.text)
        error = got.json()["error"]
        assert error.startswith(f"{path}: embeddings/{MODEL}/") and said in error, error
    assert client.get("/api/slides").status_code == 200  # the slide is still shown


def test_a_catalog_needs_a_slide():
    with pytest.raises(ViewError, match="no slide to show"):
        Catalog([], [], [])


def test_rois_are_drawn_where_their_file_puts_them(embedded_cohort, tmp_path):
    from tests.conftest import CMU_CLASSES

    roi = tmp_path / "classes.geojson"
    roi.write_text(json.dumps(CMU_CLASSES))
    slides = [open_slide(p) for p in embedded_cohort]
    paths = [str(p) for p in embedded_cohort]
    client = TestClient(make_app(Catalog(slides, paths, paths, [str(roi), None])))
    facts = client.get("/api/overlay/0?kind=roi").json()
    assert {i["name"]: i["count"] for i in facts["legend"]["items"]} == {"Stroma": 1, "Tumor": 1}
    image = png(client.get(facts["url"]))
    scale = image.shape[0] / 2967
    top, bottom = image[int(700 * scale), image.shape[1] // 2], image[int(2200 * scale), 100]
    colours = {i["name"]: tuple(i["rgba"][:3]) for i in facts["legend"]["items"]}
    assert tuple(top[:3]) == colours["Stroma"] and tuple(bottom[:3]) == colours["Tumor"]
    assert facts["extent"] == pytest.approx([2220, 2967], abs=1)
    missing = client.get("/api/overlay/1?kind=roi")
    assert missing.status_code == 404 and "no ROI file given" in missing.json()["error"]
    with pytest.raises(ViewError, match="2 ROI files for 1 slides"):
        Catalog(slides[:1], paths[:1], paths[:1], [str(roi), str(roi)])


def test_the_roi_class_of_each_tile_is_a_column_of_classes(client, embedded_ds):
    facts = client.get(f"/api/overlay/0?kind=tiles&model={MODEL}&column=roi_class").json()
    counts = {i["name"]: i["count"] for i in facts["legend"]["items"]}
    cmu = embedded_ds.tiles.slide("CMU-1-Small-Region")
    want = dict(zip(*np.unique(np.asarray(cmu["roi_class"]), return_counts=True), strict=True))
    assert counts == {str(k): int(v) for k, v in want.items()}


def test_the_listening_socket_says_it_is_tcp():
    """asyncio turns Nagle's algorithm off only on sockets that name IPPROTO_TCP; without it
    each request after the first on a kept-alive connection waited 40 ms (a delayed ACK)."""
    import socket

    from tilestore.view import bind

    sock = bind("127.0.0.1", "auto")
    try:
        assert sock.proto == socket.IPPROTO_TCP
        with pytest.raises(
            ViewError, match=rf"port {sock.getsockname()[1]} on 127.0.0.1 is in use"
        ):
            bind("127.0.0.1", sock.getsockname()[1])
    finally:
        sock.close()


@pytest.fixture(scope="module")
def mixed_scales(stores, tmp_path_factory):
    """Three stores of CMU-1 whose features of one model ("m") are at 1 um/px (s0, s2) and
    2 um/px (s1): not one population."""
    import tilestore
    from tilestore.embeddings.write import write_features
    from tilestore.plan import PlanOptions, save_plan

    folder = tmp_path_factory.mktemp("mixed")
    paths = []
    for i, mpp in enumerate((1.0, 2.0, 1.0)):
        path = folder / f"s{i}.ome.zarr"
        shutil.copytree(stores(CMU), path)
        slide = open_slide(path)
        plan = tilestore.plan_slide(slide, PlanOptions(mpp=mpp, tile=64, min_tissue=0))
        save_plan(slide, plan)
        features = np.random.default_rng(i).standard_normal((len(plan), 32)).astype(np.float32)
        write_features(path, {"name": "m", "output_dim": 32, "repo": "test/m"}, features,
                       plan=plan.name, batch_size=16)  # fmt: skip
        paths.append(path)
    return paths


def test_a_cohort_of_mixed_scales_serves_every_slides_overlays(mixed_scales):
    """Every slide's overlays answered 409 ("more than one scale"), the same-scale ones
    included: per-tile columns need only the slide's own features, and PCA, clusters and
    similarity are computed within the slides whose features may meet."""
    paths = [str(p) for p in mixed_scales]
    catalog = Catalog([open_slide(p) for p in paths], paths, paths)
    client = TestClient(make_app(catalog))
    assert "tissue" in client.get("/api/columns?model=m").json()["columns"]
    plans = load_plan(catalog.get(0).slide)[0], load_plan(catalog.get(1).slide)[0]
    for sid in range(3):
        for column in ("tissue", "pca", "clusters", "roi_class"):
            url = f"/api/overlay/{sid}?kind=tiles&model=m&column={column}&k=3"
            got = client.get(url)
            assert got.status_code == 200, (url, got.text)
        cells = client.get(f"/api/overlay/{sid}?kind=tiles&model=m&column=clusters&k=3").json()
        assert sum(i["count"] for i in cells["legend"]["items"]) == len(plans[sid % 2])
    embedded = catalog.embedded("m")
    assert [embedded.population[embedded.tiles_of(i)].tolist() for i in range(3)] == [
        [0] * len(plans[0]), [1] * len(plans[1]), [0] * len(plans[0])
    ]  # fmt: skip
    # PCA and clusters of s0 and s2 are those of the two alone, not of all three
    alone = tilestore_open(paths[0::2]).tiles.kmeans(3, pcs=16).values
    np.testing.assert_array_equal(catalog.clusters("m", 3)[embedded.population == 0], alone)
    # a similarity: within the population of the tile asked for, refused across
    ref = embedded.tiles_of(0).start
    hits = client.get(f"/api/similar/0?model=m&tile={ref}&k=50").json()
    assert hits and {h["slide"] for h in hits["hits"]} <= {0, 2}
    assert (
        client.get(f"/api/overlay/2?kind=tiles&model=m&column=similarity&ref={ref}").status_code
        == 200
    )
    across = client.get(f"/api/overlay/1?kind=tiles&model=m&column=similarity&ref={ref}")
    assert across.status_code == 404 and "may not meet slide 1's" in across.json()["error"]


def tilestore_open(paths):
    from tilestore import open_embeddings

    return open_embeddings(paths, "m")
