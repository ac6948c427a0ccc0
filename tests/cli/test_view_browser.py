"""`tilestore view` seen as a person sees it: the page opened in headless Chromium (the
system's browser, driven by Playwright): the slide's tiles load and draw, an overlay toggles
on and off with its legend, and a click on a tile gives its similarity map and the most
similar tiles. Skipped, saying why, where Playwright or a Chromium is missing (`.ci/run`
installs Debian's `chromium`). With TILESTORE_SCREENSHOTS=<folder> it also writes the
screenshots the docs show (docs/tutorials/viewer.md, docs/guide/viewer.md) there."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
from PIL import Image

from tests.cli.test_view_cli import running

MODEL = "efficientnet-lite0"


def shot(page, name: str) -> None:
    folder = os.environ.get("TILESTORE_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"view-{name}.png"))


def drawn(page) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(page.locator("#viewer").screenshot())).convert("RGB"))


def test_tiles_load_an_overlay_toggles_and_a_click_finds_similar_tiles(
    browser, embedded_cohort, embedded_ds
):
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.set_default_timeout(180_000)  # a busy CI machine: PCA and the first model opened
    errors, tiles = [], []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on(
        "response",
        lambda r: (
            tiles.append((r.status, r.headers.get("content-type"))) if "/tiles/" in r.url else None
        ),
    )
    with running(*embedded_cohort) as (url, _):
        page.goto(url)
        page.wait_for_function("window.tilestore && window.tilestore.tilesLoaded >= 4")
        assert tiles and all(t == (200, "image/jpeg") for t in tiles)
        assert drawn(page).std() > 20  # the slide drawn, not a blank canvas

        count = "window.tilestore.viewer.world.getItemCount()"
        page.check("#show-tissue")
        page.wait_for_selector('#legend .entry[data-layer="tissue"]')
        page.wait_for_function(f"{count} === 2")
        page.check("#show-plan")
        page.wait_for_selector('#legend .entry[data-layer="plan"]')
        page.wait_for_function(f"{count} === 3")
        assert "kept: " in page.inner_text('#legend .entry[data-layer="plan"]')
        shot(page, "tissue-plan")
        page.uncheck("#show-tissue")
        page.uncheck("#show-plan")
        page.wait_for_function(f"{count} === 1")
        assert not page.query_selector('#legend .entry[data-layer="tissue"]')

        page.check("#show-tiles")  # PCA colours of the model's tiles
        page.wait_for_selector('#legend .entry[data-layer="tiles"]')
        page.wait_for_function(f"{count} === 2")
        shot(page, "pca")

        page.select_option("#column", "similarity")
        ref = 3  # a tile of CMU-1-Small-Region, clicked at its centre
        x = float(embedded_ds["x"][ref]) + 112
        y = float(embedded_ds["y"][ref]) + 112
        at = page.evaluate(
            f"(() => {{ const p = window.tilestore.viewer.world.getItemAt(0)"
            f".imageToViewerElementCoordinates(new OpenSeadragon.Point({x}, {y}));"
            f" return [p.x, p.y]; }})()"
        )
        box = page.locator("#viewer").bounding_box()
        page.mouse.click(box["x"] + at[0], box["y"] + at[1])
        page.wait_for_function("document.querySelectorAll('#hits .hit img').length === 12")
        page.wait_for_function(
            "document.querySelector('#legend').innerText.includes('cosine similarity to tile 3')"
        )
        page.wait_for_function(f"{count} === 2")
        assert page.evaluate("window.tilestore.hits.ref.tile") == ref
        page.wait_for_function(
            "[...document.querySelectorAll('#hits img')].every(i => i.complete && i.naturalWidth)"
        )
        shot(page, "similarity")
    assert not errors
