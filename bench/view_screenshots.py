"""The screenshots of `tilestore view`, made as a person would see them: real stores
embedded with EfficientNet-Lite0 (real ImageNet weights, on the CPU), opened in the viewer
and photographed in headless Chromium (Playwright driving the system's browser).

- CMU-1-Small-Region: its tissue mask and a 0.5 um/px, 224 px plan (kept and left-out cells);
  PCA colours of its tiles; the similarity to a clicked tile with the most similar tiles;
- the same tissue with blue marker ink and a fold painted on it (`tests/tilestore/artefacts.py`,
  as the QC tests paint them), after `tilestore qc`: the QC overlay.

    python bench/view_screenshots.py --out bench/figures
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import tifffile

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from tests.cli.test_view_browser import ARGS  # noqa: E402
from tests.tilestore import artefacts as A  # noqa: E402

DATA = Path(os.environ.get("TILESTORE_DATA", HERE.parents[1] / "shared" / "data"))
CMU = DATA / "slides" / "CMU-1-Small-Region.svs"


def tilestore(*args) -> None:
    subprocess.run([sys.executable, "-m", "tilestore.cli", *map(str, args)], check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip


def stores(work: Path) -> list[Path]:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    image = tifffile.imread(CMU)
    painted = A.folded(A.inked(image, "blue").image).image
    tif = work / "CMU-1-painted.tif"
    tifffile.imwrite(tif, painted, tile=(256, 256), compression="zlib")
    tilestore("convert", CMU, "-o", work)
    tilestore("convert", tif, "-o", work, "--mpp", A.MPP)
    made = [work / "CMU-1-Small-Region.ome.zarr", work / "CMU-1-painted.ome.zarr"]
    for store in made:
        tilestore("tissue", store)
        tilestore("qc", store)
        tilestore("plan", store, "--mpp", 0.5, "--tile", 224)
        tilestore("embed", store, "--model", "efficientnet-lite0")
    return made


def shot(page, path: Path) -> None:
    page.screenshot(path=str(path), type="jpeg", quality=85)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=HERE / "figures")
    parser.add_argument("--work", type=Path, default=HERE / "data" / "view")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "chromium")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    made = stores(args.work)
    server = subprocess.Popen(
        [sys.executable, "-m", "tilestore.cli", "view", *map(str, made), "--port", "auto"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        line = ""
        while "Ctrl-C" not in line:
            line = server.stdout.readline()
        url = re.search(r"http://\S+/", line).group(0)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=args.chromium, args=ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(url)
            page.wait_for_function("window.tilestore && window.tilestore.tilesLoaded >= 4")
            count = "window.tilestore.viewer.world.getItemCount()"

            def settle(items: int) -> None:
                page.wait_for_function(f"{count} === {items}")
                time.sleep(1.5)  # the overlay faded in

            page.check("#show-tissue")
            page.check("#show-plan")
            settle(3)
            shot(page, args.out / "view-tissue-plan.jpg")
            page.uncheck("#show-tissue")
            page.uncheck("#show-plan")
            page.check("#show-tiles")
            settle(2)
            shot(page, args.out / "view-pca.jpg")
            page.select_option("#column", "similarity")
            box = page.locator("#viewer").bounding_box()
            page.mouse.click(box["x"] + box["width"] * 0.47, box["y"] + box["height"] * 0.3)
            page.wait_for_function("document.querySelectorAll('#hits .hit img').length === 12")
            page.wait_for_function(
                "[...document.querySelectorAll('#hits img')].every(i => i.complete)"
            )
            settle(2)
            shot(page, args.out / "view-similarity.jpg")
            page.uncheck("#show-tiles")
            page.click("#gallery-close")
            page.click("#slides li:nth-child(2)")
            page.wait_for_function(f"{count} === 1")
            page.check("#show-qc")
            settle(2)
            shot(page, args.out / "view-qc.jpg")
            browser.close()
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=30)
    names = ("tissue-plan", "pca", "similarity", "qc")
    print(" ".join(str(args.out / f"view-{n}.jpg") for n in names))


if __name__ == "__main__":
    main()
