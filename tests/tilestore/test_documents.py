"""Every stored document a command reads (each zarr.json of a store: the root, levels,
labels, plans, embeddings) replaced by arbitrary bytes or by JSON of the wrong shape: each
public reader answers or refuses with a TilestoreError naming the store, never the JSON
parser's, zarr's or a KeyError of its own."""

from __future__ import annotations

import json
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tilestore.conversion import describe
from tilestore.embeddings import open_embeddings
from tilestore.errors import TilestoreError
from tilestore.masks import read_tissue
from tilestore.plan import list_plans, load_plan
from tilestore.qc import read_qc, read_summary
from tilestore.reading import open_slide

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=12,
)


def _documents(embedded_cohort):
    store = embedded_cohort[0]
    return store, sorted(str(p.relative_to(store)) for p in store.rglob("zarr.json"))


def _payloads(document: dict):
    """Bytes that are not JSON, JSON that is not metadata, and metadata whose attributes
    are of the wrong shape."""
    attributes = st.fixed_dictionaries({"tilestore": JSON, "ome": JSON}) | JSON
    shaped = attributes.map(lambda a: json.dumps({**document, "attributes": a}).encode())
    return st.binary(max_size=64) | JSON.map(lambda v: json.dumps(v).encode()) | shaped


def _readers(store):
    yield lambda: open_slide(store)
    slide = open_slide(store)
    yield lambda: list_plans(slide)
    yield lambda: load_plan(slide, "classes")
    yield lambda: read_tissue(slide)
    yield lambda: read_qc(slide)
    yield lambda: read_summary(slide)
    yield lambda: slide.read_region(0, 0, 64, 64, level=0)
    yield lambda: open_embeddings([store], "efficientnet-lite0").features.values
    yield lambda: describe(store)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.data())
def test_any_stored_document_damaged_is_a_tilestore_error(embedded_cohort, tmp_path_factory, data):
    source, documents = _documents(embedded_cohort)
    name = data.draw(st.sampled_from(documents))
    store = tmp_path_factory.mktemp("documents") / source.name
    shutil.copytree(source, store)
    target = store / name
    payload = data.draw(_payloads(json.loads(target.read_text())))
    target.write_bytes(payload)
    try:
        for read in _readers(store):
            try:
                read()
            except TilestoreError as exc:
                assert str(exc), name
    except TilestoreError:
        pass  # the store itself refused to open: one line, as the command prints it
    finally:
        shutil.rmtree(store.parent)


def test_the_documents_include_every_kind(embedded_cohort):
    _, documents = _documents(embedded_cohort)
    kinds = {d.split("/")[0] for d in documents}
    assert {"zarr.json", "0", "labels", "plans", "embeddings"} <= kinds
    pytest.importorskip("hypothesis")
