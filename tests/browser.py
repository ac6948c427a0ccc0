"""Headless Chromium for the tests that look at pages (the viewer, the docs site): the
system's browser driven by Playwright, or a skip saying which is missing (`.ci/run` installs
Debian's `chromium`). A pytest plugin (tests/conftest.py names it): its `browser` fixture
is every test module's.
"""

from __future__ import annotations

import os
import shutil

import pytest

ARGS = [  # headless, as root, nothing fetched from outside
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium() -> str:
    found = os.environ.get("TILESTORE_CHROMIUM") or next(
        filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None
    )
    if not found:
        pytest.skip("no Chromium here (apt-get install chromium; or set TILESTORE_CHROMIUM)")
    return found


@pytest.fixture(scope="module")
def browser():
    sync = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    executable = chromium()
    with sync.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=ARGS)
        yield launched
        launched.close()
