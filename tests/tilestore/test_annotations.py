"""Annotation files: every real sample parsed or rejected with a reason; geometry rules."""

from __future__ import annotations

import json

import numpy as np
import pytest
import shapely

from tests.conftest import ANNOTATIONS, MONUSEG
from tilestore.errors import AnnotationError
from tilestore.plan.annotations import load_annotations

SAMPLES = ANNOTATIONS / "format_samples"

# file -> (format, count, classes) for areas, or a phrase of the rejection
EXPECTED = {
    "qupath-polygon.json": ("qupath-geojson", 1, [""]),
    "qupath-rectangle.json": ("qupath-geojson", 1, [""]),
    "qupath-ellipse.json": ("qupath-geojson", 1, [""]),
    "qupath-brush.json": ("qupath-geojson", 1, [""]),
    "qupath-wand.json": ("qupath-geojson", 1, [""]),
    "qupath-polygon-cell-classified.json": ("qupath-geojson", 4, ["Cell", "Nucleus"]),
    "asap-polygon.xml": ("asap-xml", 1, [""]),
    "qupath-point.json": "found points",
    "qupath-multipoint.json": "found multipoints",
    "qupath-line.json": "found lines",
    "qupath-polyline.json": "found lines",
    "asap-dot.xml": "found multipoints",
    "asap-pointset.xml": "found multipoints",
    "cytomine-circle.txt": "Cytomine annotation JSON is not supported",
    "cytomine-freehand-line.txt": "Cytomine annotation JSON is not supported",
    "cytomine-freehand-polygon.txt": "Cytomine annotation JSON is not supported",
    "cytomine-line.txt": "Cytomine annotation JSON is not supported",
    "cytomine-point.txt": "Cytomine annotation JSON is not supported",
    "cytomine-polygon.txt": "Cytomine annotation JSON is not supported",
    "cytomine-rectangle.txt": "Cytomine annotation JSON is not supported",
    "pathologycore-area.json": "Sectra PathologyCore JSON is not supported",
    "pathologycore-polyline.json": "Sectra PathologyCore JSON is not supported",
}


def test_every_format_sample_is_covered():
    if not SAMPLES.exists():
        pytest.skip(f"real test data not found: {SAMPLES}")
    assert sorted(p.name for p in SAMPLES.iterdir()) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_format_sample(annotation_path, name):
    path = annotation_path(f"format_samples/{name}")
    expected = EXPECTED[name]
    if isinstance(expected, str):
        with pytest.raises(AnnotationError, match=expected) as err:
            load_annotations(path)
        assert str(path) in str(err.value)
        return
    fmt, count, classes = expected
    rois = load_annotations(path)
    assert (rois.format, len(rois), rois.class_names) == (fmt, count, classes)
    assert all(shapely.get_type_id(g) in (3, 6) for g in rois.geometries)
    assert all(shapely.is_valid(rois.geometries))
    # the samples belong to one slide region: x 17000-26700, y 15300-20100 (y down)
    xmin, ymin, xmax, ymax = rois.bounds()
    assert 17000 <= xmin < xmax <= 27500 and 15200 <= ymin < ymax <= 20100


def test_qupath_rectangle_is_exact(annotation_path):
    rois = load_annotations(annotation_path("format_samples/qupath-rectangle.json"))
    assert rois.geometries[0].equals(shapely.box(26268, 15298, 26478, 15474))


def test_monuseg_aperio_xml(annotation_path):
    rois = load_annotations(annotation_path(f"{MONUSEG}.xml"), size=(1000, 1000))
    assert rois.format == "aperio-xml" and len(rois) == 314
    assert rois.file_mpp == pytest.approx(0.2456)
    assert any("repaired 190 invalid polygons" in w for w in rois.warnings)
    # The vertices at x = -2 are on a zero-area spike that the repair turns into a line and
    # drops; the nucleus itself lies inside the image, so nothing needs clipping.
    xmin, ymin, xmax, ymax = rois.bounds()
    assert xmin >= 0 and ymin >= 0 and xmax <= 1000 and ymax <= 1000
    assert all(shapely.is_valid(rois.geometries))


def _aperio(tmp_path, regions: str, mpp: str = "0.25") -> str:
    path = tmp_path / "a.xml"
    path.write_text(
        f'<Annotations MicronsPerPixel="{mpp}"><Annotation Id="1" Name="Tumor">'
        f"<Regions>{regions}</Regions></Annotation></Annotations>"
    )
    return path


def _region(xy, negative=0, kind=0) -> str:
    vertices = "".join(f'<Vertex X="{x}" Y="{y}"/>' for x, y in xy)
    return (
        f'<Region Id="1" Type="{kind}" NegativeROA="{negative}">'
        f"<Vertices>{vertices}</Vertices></Region>"
    )


def test_aperio_negative_region_is_a_hole(tmp_path):
    outer = _region([(0, 0), (100, 0), (100, 100), (0, 100)])
    hole = _region([(40, 40), (60, 40), (60, 60), (40, 60)], negative=1)
    rois = load_annotations(_aperio(tmp_path, outer + hole))
    assert len(rois) == 1 and rois.class_names == ["Tumor"]
    assert rois.geometries[0].area == pytest.approx(100 * 100 - 20 * 20)


def test_aperio_ellipse_and_rectangle(tmp_path):
    ellipse = _region([(0, 0), (200, 100)], kind=2)
    rect = _region([(300, 0), (400, 0), (400, 50), (300, 50)], kind=1)
    rois = load_annotations(_aperio(tmp_path, ellipse + rect))
    assert rois.geometries[0].area == pytest.approx(np.pi * 100 * 50, rel=0.01)
    assert rois.geometries[1].area == pytest.approx(100 * 50)


def test_aperio_ruler_only_is_rejected(tmp_path):
    with pytest.raises(AnnotationError, match="found lines"):
        load_annotations(_aperio(tmp_path, _region([(0, 0), (10, 10)], kind=4)))


def _geojson(tmp_path, data, name="a.geojson"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_geojson_multipolygon_with_holes_and_derived_class(tmp_path):
    square = [[0, 0], [100, 0], [100, 100], [0, 100], [0, 0]]
    hole = [[10, 10], [20, 10], [20, 20], [10, 20], [10, 10]]
    other = [[200, 0], [300, 0], [300, 10], [200, 10], [200, 0]]
    feature = {
        "type": "Feature",
        "geometry": {"type": "MultiPolygon", "coordinates": [[square, hole], [other]]},
        "properties": {"classification": {"names": ["Tumor", "Positive"]}},
    }
    rois = load_annotations(
        _geojson(tmp_path, {"type": "FeatureCollection", "features": [feature]})
    )
    assert rois.class_names == ["Tumor: Positive"]
    assert rois.geometries[0].area == pytest.approx(100 * 100 - 100 + 1000)


def test_geojson_old_qupath_list_and_string_class(tmp_path):
    features = [
        {
            "type": "Feature",
            "geometry": {
                "type": "Polygon",
                "coordinates": [[[0, 0], [10, 0], [10, 10], [0, 10], [0, 0]]],
            },
            "properties": {"classification": "Stroma"},
        }
    ]
    rois = load_annotations(_geojson(tmp_path, features))
    assert rois.classes.tolist() == ["Stroma"]


def test_mixed_file_keeps_areas_and_says_what_it_skipped(tmp_path):
    features = [
        {"type": "Feature", "geometry": {"type": "Point", "coordinates": [5, 5]}},
        {
            "type": "Feature",
            "geometry": {
                "type": "Polygon",
                "coordinates": [[[0, 0], [10, 0], [10, 10], [0, 10], [0, 0]]],
            },
        },
    ]
    rois = load_annotations(_geojson(tmp_path, {"type": "FeatureCollection", "features": features}))
    assert len(rois) == 1
    assert rois.warnings == ("skipped 1 point/line shapes (ROIs must be areas)",)


def test_bowtie_is_repaired(tmp_path):
    bowtie = [[0, 0], [10, 10], [10, 0], [0, 10], [0, 0]]
    rois = load_annotations(
        _geojson(
            tmp_path, {"type": "Feature", "geometry": {"type": "Polygon", "coordinates": [bowtie]}}
        )
    )
    assert shapely.is_valid(rois.geometries[0])
    assert rois.geometries[0].area == pytest.approx(50)
    assert "repaired 1 invalid polygons" in rois.warnings[0]


def test_scale_and_clip(tmp_path):
    square = {
        "type": "Feature",
        "geometry": {
            "type": "Polygon",
            "coordinates": [[[10, 10], [60, 10], [60, 60], [10, 60], [10, 10]]],
        },
    }
    rois = load_annotations(_geojson(tmp_path, square), scale=2.0, size=(100, 100))
    assert rois.geometries[0].equals(shapely.box(20, 20, 100, 100))
    assert any("clipped 1" in w for w in rois.warnings)


def test_all_outside_the_slide(tmp_path):
    square = {
        "type": "Feature",
        "geometry": {
            "type": "Polygon",
            "coordinates": [[[500, 500], [600, 500], [600, 600], [500, 600], [500, 500]]],
        },
    }
    with pytest.raises(AnnotationError, match="no annotated area lies inside the slide"):
        load_annotations(_geojson(tmp_path, square), size=(100, 100))


def test_select_unknown_class(annotation_path):
    rois = load_annotations(annotation_path("format_samples/qupath-polygon-cell-classified.json"))
    assert len(rois.select("Nucleus")) == 2
    with pytest.raises(AnnotationError, match=r"no annotations of class 'Tumor'.*'Cell'"):
        rois.select("Tumor")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ("<Annotations><Annotation>", "malformed XML"),
        ("<Other/>", "neither Aperio"),
        ('{"type": "Topology"}', "not GeoJSON"),
        ("hello", "not an annotation file"),
    ],
)
def test_bad_files(tmp_path, content, message):
    path = tmp_path / "bad.ann"
    path.write_text(content)
    with pytest.raises(AnnotationError, match=message):
        load_annotations(path)


def test_missing_file(tmp_path):
    with pytest.raises(AnnotationError, match="cannot read"):
        load_annotations(tmp_path / "nope.geojson")
