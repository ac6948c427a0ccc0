"""Bags: a cohort's features read from its stores once onto the device, a patient's slides
joined; where they do not fit, streamed from the stores per batch, the same values."""

from __future__ import annotations

import numpy as np

import tilestore
from tilestore.learn import build_cohort, load_bags

from .cohorts import copies


def test_streamed_bags_equal_the_resident_ones(embedded_cohort, tmp_path):
    stores, _ = copies(embedded_cohort, tmp_path, n=4)
    table = tmp_path / "patients.csv"
    table.write_text("PATIENT,status\nP0,neg\nP1,pos\n")
    slides = tmp_path / "slides.csv"  # two patients of two slides each
    slides.write_text("FILENAME,PATIENT\nP0,P0\nP1,P1\nP2,P0\nP3,P1\n")
    cohort = build_cohort(table, stores, "efficientnet-lite0", targets="status", slides=slides)
    resident = load_bags(cohort, device="cpu")
    lines = []
    streamed = load_bags(cohort, device="cpu", memory=0, progress=lines.append)
    assert not resident.streamed and streamed.streamed and "streamed" in lines[0]
    want = tilestore.open_embeddings(stores[0], "efficientnet-lite0").features.values
    tiles = len(want)
    assert resident.patients == 2 and resident.tiles(0) == 2 * tiles
    for bags in (resident, streamed):
        x, mask = bags.batch([0, 1])
        assert x.shape == (2, 2 * tiles, want.shape[1]) and bool(mask.all())
        np.testing.assert_array_equal(x[0, :tiles].numpy(), want)
    np.testing.assert_array_equal(resident.batch([1])[0].numpy(), streamed.batch([1])[0].numpy())
