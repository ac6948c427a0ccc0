"""The documentation site cannot rot: it builds in strict mode (a broken reference, a missing
page or a docstring mkdocstrings cannot render fails it), its reference holds every public
name of every package face and every command, the pages' runnable examples run (CPU, the
shared sample slide, efficientnet-lite0), no internal link or anchor is dead, and a real
browser renders it and searches it. docs/README.md says the conventions."""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from functools import partial
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from tests.conftest import CMU, DATA, REPO, SLIDES, real
from tests.shown import check_bash, check_python, shown_blocks
from tests.test_architecture import FACES

DOCS = REPO / "docs"
MKDOCS = Path(sys.executable).with_name("mkdocs")
# `<!-- run -->` (or `<!-- run: exit N -->`) on the line before a ```bash or ```python block
RUNNABLE = re.compile(
    r"^<!-- run(?:: exit (?P<code>\d+))? -->\n```(?P<lang>\w+)\n(?P<body>.*?)\n```$",
    re.MULTILINE | re.DOTALL,
)


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    """The site built once a run, strict, as a user builds it: by the first of xdist's
    workers to ask, the others waiting for it on a lock in the run's shared folder (the
    build runs the tutorial notebooks: a minute or two)."""
    from filelock import FileLock

    if not MKDOCS.exists():
        pytest.skip(f"mkdocs is not installed beside {sys.executable} (pip install -e '.[docs]')")
    shared = tmp_path_factory.getbasetemp()  # this run's: under xdist, its workers' parent
    shared = shared.parent if os.environ.get("PYTEST_XDIST_WORKER") else shared
    out, built = shared / "site", shared / "site.built"
    with FileLock(str(shared / "site.lock")):
        if not built.exists():
            _build(out)
            built.touch()
    return out


def _build(out: Path) -> None:
    # the tutorial notebooks run in the build against the sample data, where it is here
    execute = "1" if (DATA / "slides").is_dir() else "0"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "TILESTORE_DOCS_EXECUTE": execute}
    start = time.perf_counter()
    done = subprocess.run(
        [str(MKDOCS), "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**env, "TILESTORE_DATA": str(DATA.resolve())},
    )
    seconds = time.perf_counter() - start
    assert done.returncode == 0, done.stderr[-4000:]
    print(f"mkdocs build --strict: {seconds:.1f} s (the notebooks executed: {execute})")


def test_the_site_builds_in_strict_mode_with_every_section(site):
    for page in (
        "index.html",
        "getting-started/first-slide/index.html",
        "tutorials/01_single_slide_roi_pca/index.html",
        "how-to/cohort-slurm/index.html",
        "reference/cli/index.html",
        "reference/models/index.html",
        "reference/exit-codes/index.html",
        "reference/store-layout/index.html",
        "performance/results/index.html",
    ):
        assert (site / page).is_file(), page
    # the generated tables are in, not their markers
    for page in site.rglob("*.html"):
        assert "<!-- generated:" not in page.read_text(), page


def _ids(html: str) -> set[str]:
    return set(re.findall(r'\bid="([^"]+)"', html))


def test_every_public_name_of_every_face_is_documented(site):
    missing, counted = [], 0
    for face in FACES:
        page = site / "reference" / "api" / face / "index.html"
        ids = _ids(page.read_text()) if page.exists() else set()
        names = importlib.import_module(face).__all__
        counted += len(names)
        missing += [f"{face}.{name}" for name in names if f"{face}.{name}" not in ids]
    assert missing == []
    print(f"{counted} public names in {len(FACES)} faces, all documented")


def _commands() -> list[list[str]]:
    import typer.main

    from tilestore.cli.main import app

    def walk(command, words):
        yield words
        for name, sub in getattr(command, "commands", {}).items():
            if not sub.hidden:
                yield from walk(sub, [*words, name])

    return list(walk(typer.main.get_command(app), ["tilestore"]))


def test_every_command_and_flag_is_documented(site):
    import typer.main

    from tilestore.cli.main import app

    html = (site / "reference" / "cli" / "index.html").read_text()
    ids, commands = _ids(html), _commands()
    assert [w for w in commands if "-".join(w) not in ids] == []
    root = typer.main.get_command(app)
    flags = set()
    for words in commands:
        command = root
        for word in words[1:]:
            command = command.commands[word]
        flags |= {opt for p in command.params for opt in p.opts if opt.startswith("--")}
    cells = " ".join(re.findall(r"<td><code>(.*?)</code></td>", html))
    assert sorted(flags - set(re.findall(r"--[\w-]+", cells))) == []
    print(f"{len(commands)} commands, {len(flags)} distinct flags documented")


# the HTML elements a page of this site is made of: any other tag is text a browser hides,
# such as a docstring's `embeddings/<model>` taken for a tag
_NAMES = (
    "a abbr article aside b blockquote body br button caption clipboard-copy code col "
    "colgroup dd del details div dl dt em figcaption figure footer form h1 h2 h3 h4 h5 h6 "
    "head header hr html i img input kbd label li link main mark meta nav noscript ol p path "
    "pre rect script section small span strong style sub summary sup svg table tbody td "
    "tfoot th thead title tr u ul"
    # and the SVG of the notebooks' outputs (xarray's icons, dask's chunk pictures)
    " defs g line polygon symbol text use"
)
ELEMENTS = frozenset(_NAMES.split())


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)


def test_no_text_is_taken_for_an_html_tag(site):
    """`<model>`, `<name>`, `<arch>` in docstrings and command help are shown, not hidden."""
    unknown = {}
    for page in sorted(site.rglob("*.html")):
        parser = _Tags()
        parser.feed(page.read_text())
        if parser.tags - ELEMENTS:
            unknown[str(page.relative_to(site))] = sorted(parser.tags - ELEMENTS)
    assert unknown == {}


# --- links -------------------------------------------------------------------------------


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        for key, value in attrs:
            if value and (key, tag) in {
                ("href", "a"),
                ("src", "img"),
                ("href", "link"),
                ("src", "script"),
            }:
                self.links.append(value)


def test_no_dead_internal_link_or_anchor(site):
    ids: dict[Path, set[str]] = {}

    def anchors(page: Path) -> set[str]:
        if page not in ids:
            ids[page] = _ids(page.read_text()) | set(
                re.findall(r'\bname="([^"]+)"', page.read_text())
            )
        return ids[page]

    dead, checked = [], 0
    for page in sorted(site.rglob("*.html")):
        parser = _Links()
        parser.feed(page.read_text())
        for link in parser.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith(("mailto:", "data:")):
                continue
            path = unquote(parts.path)
            # 404.html's links are from the site's root (no site_url: served at /)
            base = site if path.startswith("/") else page.parent
            target = (base / path.lstrip("/")).resolve() if path else page
            if target.is_dir():
                target = target / "index.html"
            checked += 1
            if not target.exists():
                dead.append(f"{page.relative_to(site)}: {link}")
            elif (
                parts.fragment
                and target.suffix == ".html"
                and unquote(parts.fragment) not in anchors(target)
            ):
                dead.append(f"{page.relative_to(site)}: {link} (no such anchor)")
    assert dead == []
    print(f"{checked} internal links checked")


# --- the Markdown as files (GitHub), before any build ---------------------------------------

# the Markdown read where it is, as GitHub renders it: the site's pages, and the sources the
# site shows under another name (docs/hooks.py `copies`)
SOURCES = [*sorted(DOCS.rglob("*.md")), REPO / "README.md", REPO / "ARCHITECTURE.md"]
SOURCES.append(REPO / "bench" / "RESULTS.md")


def _dead_links(pages: list[Path]) -> list[str]:
    """Each relative link of `pages` that is no file of the repository, or no anchor of the
    Markdown it names, read as files."""
    from docs import links

    dead = []
    for page in pages:
        for match in links.targets(page.read_text()):
            target = match["target"]
            if not links.relative(target):
                continue
            parts = urlsplit(target)
            file = (page.parent / unquote(parts.path)).resolve()
            where = f"{page.relative_to(REPO)}: {target}"
            if not file.exists():
                dead.append(where)
            elif (
                parts.fragment
                and file.suffix == ".md"
                and unquote(parts.fragment) not in links.anchors(file.read_text())
            ):
                dead.append(f"{where} (no such anchor)")
    return dead


def test_every_relative_link_of_the_markdown_resolves_as_a_file_and_anchor():
    """On GitHub, before any build: no link to a page that exists only on the site (a
    generated page, a copy), no mkdocs-only form; the site's hook points the links to the
    sources it copies at their copies (test_no_dead_internal_link_or_anchor checks there)."""
    assert _dead_links(SOURCES) == []


def test_a_link_to_a_page_only_the_site_has_or_to_no_heading_is_found(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other\n\n## A `code` heading: with (punctuation)\n")
    page.write_text(
        "[results](../performance/results.md) ![x](figures/x.png) [ok](other.md)\n"
        "[ok](other.md#a-code-heading-with-punctuation) [no](other.md#a-code-heading)\n"
        "`[not a link](nowhere.md)` [web](https://example.org/x.md) [here](#other)\n"
        "```\n[in a block](nowhere.md)\n```\n[ref]: missing.md\n"
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys.modules[__name__], "REPO", tmp_path)
        dead = _dead_links([page])
    assert dead == [
        "page.md: ../performance/results.md",
        "page.md: figures/x.png",
        "page.md: other.md#a-code-heading (no such anchor)",
        "page.md: missing.md",
    ]


def test_the_site_anchors_each_heading_as_github_does():
    """mkdocs.yml's toc slugify gives every heading of the Markdown the anchor `links.slug`
    (GitHub's rule) gives it, so a link's anchor holds in both places."""
    import markdown
    from mkdocs.utils import yaml_load

    from docs import links

    config = yaml_load((REPO / "mkdocs.yml").read_text())
    extensions = config["markdown_extensions"]
    toc = next(e["toc"] for e in extensions if isinstance(e, dict) and "toc" in e)
    headings = {h for page in SOURCES for h in links.headings(page.read_text())}
    differ = {}
    for heading in sorted(headings):
        html = markdown.markdown(
            f"## {heading}", extensions=["toc", "attr_list"], extension_configs={"toc": toc}
        )
        made = re.search(r'id="([^"]*)"', html)[1]
        if made != links.slug(heading):
            differ[heading] = (made, links.slug(heading))
    assert differ == {}
    assert len(headings) > 200  # the scan found them


def test_the_committed_generated_sections_are_what_the_code_makes_now():
    """The tables generated from the code (docs/hooks.py `SECTIONS`) are committed between
    their markers, each where a page says, and are the code's now: a stale one fails here
    (`python -m docs.hooks` writes them again)."""
    from docs import hooks

    stale, named = [], []
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text()
        named += [m["name"] for m in hooks.SECTION.finditer(text)]
        if hooks.filled(text, str(page), markers=True) != text:
            stale.append(str(page.relative_to(REPO)))
    assert stale == [], "stale: run python -m docs.hooks"
    assert sorted(named) == sorted(hooks.SECTIONS)  # each once, none only at build time
    assert "<!-- generated" not in hooks.filled(text, str(page), markers=False)


@pytest.mark.parametrize(
    "text",
    [
        "<!-- generated: models -->\n",
        "<!-- generated: models -->\n| x |\n",
        "<!-- end generated -->\n",
        "<!-- generated: no-such -->\n<!-- end generated -->\n",
    ],
)
def test_a_generated_section_without_its_end_or_not_known_is_refused(text):
    from docs import hooks

    with pytest.raises(ValueError, match=r"page\.md: .*(not in pairs|no generated section)"):
        hooks.filled(f"# A page\n\n{text}", "page.md", markers=True)


def test_a_stale_section_is_made_again_from_the_code():
    from docs import hooks

    stale = "<!-- generated: exit-codes-status -->\n| exit | old |\n<!-- end generated -->\n"
    made = hooks.filled(stale, "page.md", markers=True)
    assert "| old |" not in made and hooks.exit_codes_status() in made
    assert hooks.filled(made, "page.md", markers=True) == made  # once made, it holds


def test_the_site_points_a_link_to_a_copied_source_at_its_copy():
    from docs import hooks

    text = (
        "[r](../../bench/RESULTS.md#a-b) ![f](../../bench/figures/view-qc.jpg) "
        "[e](../embed.md) [a](../../ARCHITECTURE.md) [s](../../tilestore/slide.py) "
        "`[c](../../ARCHITECTURE.md)`"
    )
    made = hooks.site_links(text, "docs/guide/embed.md", "guide/embed.md")
    assert made == (
        "[r](../performance/results.md#a-b) ![f](../figures/view-qc.jpg) "
        "[e](../embed.md) [a](../architecture.md) [s](../../tilestore/slide.py) "
        "`[c](../../ARCHITECTURE.md)`"
    )
    index = "docs/reference/api/index.md"
    api = hooks.site_links("[e](../../../embed/__init__.py)", index, "reference/api/index.md")
    assert api == "[e](tilestore.embed.md)"
    # ARCHITECTURE.md, shown as architecture.md, links to the docs from the root
    assert hooks.site_links("[g](docs/guide/qc.md)", "ARCHITECTURE.md", "architecture.md") == (
        "[g](guide/qc.md)"
    )


# --- blocks shown, not run ---------------------------------------------------------------

SHOWN = sorted(p for p in DOCS.rglob("*.md") if shown_blocks(p.read_text()))


@pytest.mark.parametrize("page", SHOWN, ids=[str(p.relative_to(DOCS)) for p in SHOWN])
def test_blocks_shown_not_run_name_commands_flags_and_calls_that_exist(page):
    """A GPU's, a cluster's or a user's commands, checked against the CLI's parser and the
    API's signatures (tests/shown.py): they cannot name a flag, a value or a parameter that
    is not there."""
    checked = []
    for lang, body in shown_blocks(page.read_text()):
        checked += check_bash(body) if lang == "bash" else check_python(body)
    print(f"{page.relative_to(DOCS)}: {len(checked)} commands and calls checked")


def test_every_bash_or_python_block_is_run_or_checked():
    """None escapes both: a block is marked to run (and matched by RUNNABLE) or checked."""
    escaped = {}
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text()
        fences = len(re.findall(r"^[ \t]*```(?:bash|python)$", text, re.MULTILINE))
        if fences != len(shown_blocks(text)) + len(_runnable(page)):
            escaped[str(page.relative_to(DOCS))] = fences
    assert escaped == {}


@pytest.mark.parametrize(
    "lang, body, cause",
    [
        ("bash", "tilestore embed s.ome.zarr --model uni --no-such", "No such option"),
        ("bash", "srun tilestore embed s --model uni --decode fast", "decode='fast'"),
        ("bash", "tilestore embed s --model uni --batch-size many", "batch_size='many'"),
        ("bash", 'tilestore embed s --shard "${SLURM_ARRAY_TASK_ID}of4"', "shard='0of4'"),
        ("bash", "tilestore models lst", r"no subcommand \['lst'\]"),
        ("bash", "python bench/convert.py --sizes 4", "no flag --sizes"),
        ("python", "from tilestore.embed import Options\nOptions(batchsize=8)", "batchsize"),
        ("python", "import tilestore\ntilestore.open_embedding('x', 'uni')", "no open_embedding"),
        ("python", "from tilestore.embed import Embedders", "no Embedders"),
    ],
)
def test_a_shown_block_that_names_what_is_not_there_fails(lang, body, cause):
    with pytest.raises(AssertionError, match=cause):
        check_bash(body) if lang == "bash" else check_python(body)


# --- the tutorial notebooks ---------------------------------------------------------------

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def _draws(source: str) -> bool:
    last = source.strip().splitlines()[-1] if source.strip() else ""
    return last.startswith(("plot_map(", "plot_gallery(", "plot_hits(", "render_preview("))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebooks_are_kept_without_outputs_and_shown_on_the_site(path):
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    assert not any(c.get("outputs") for c in notebook.cells if c.cell_type == "code"), (
        f"{path.name}: commit notebooks without outputs (the docs build runs them)"
    )
    assert (DOCS / "tutorials" / path.name).resolve() == path.resolve()
    assert any(_draws(c.source) for c in notebook.cells if c.cell_type == "code")


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_the_site_shows_each_notebook_run_with_each_figure_where_it_is_drawn(site, path):
    """The build ran it top to bottom (a cell that raises fails the build, docs/notebooks.py),
    against the sample data, with the package as installed; each cell that draws shows its
    figure inline, under that cell, as a reader sees it in Jupyter."""
    import nbformat

    real(SLIDES)
    html = (site / "tutorials" / path.stem / "index.html").read_text()
    cells = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    starts = [html.index(f'id="cell-id={c.id}"') for c in cells]
    shown = [html[a:b] for a, b in zip(starts, [*starts[1:], len(html)], strict=True)]
    assert sum("jp-OutputArea-output" in part for part in shown) >= len(cells) // 2
    for cell, part in zip(cells, shown, strict=True):
        if _draws(cell.source):
            last = cell.source.strip().splitlines()[-1]
            assert "data:image/png" in part, f"{path.name}: no figure under: {last}"


# --- runnable examples -------------------------------------------------------------------


def _runnable(page: Path) -> list[re.Match]:
    text = page.read_text()
    blocks = list(RUNNABLE.finditer(text))
    markers = re.findall(r"^<!-- run", text, re.MULTILINE)
    assert len(blocks) == len(markers), f"{page}: a run marker not before a block"
    return blocks


PAGES = sorted(p for p in DOCS.rglob("*.md") if _runnable(p))


def _arrow_abort_at_exit(done: subprocess.CompletedProcess, block: dict) -> bool:
    """Whether a block that reads Parquet ran to its end (its last line printed, its asserts
    passed) and only then met pyarrow's known abort at interpreter exit (SIGABRT, "terminate
    called without an active exception": apache/arrow#34314, a parquet thread destroyed at
    shutdown; seen once in the suite on the loaded 2-core box, not reproduced in 30 runs)."""
    return (
        done.returncode == -6
        and not block["code"]
        and "read_parquet" in block["body"]
        and done.stderr.strip() == "terminate called without an active exception"
        and bool(done.stdout.strip())
    )


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_runnable_examples_run(page, tmp_path, stores):
    """Each page's runnable blocks, in order, in a fresh folder holding `slides/` (the shared
    sample slides) and `stores/` (the sample slide converted once per session)."""
    (tmp_path / "slides").symlink_to(real(SLIDES).resolve())
    (tmp_path / "stores").mkdir()
    shutil.copytree(stores(CMU), tmp_path / "stores" / f"{Path(CMU).stem}.ome.zarr")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for block in _runnable(page):
        if block["lang"] == "bash":
            command = ["bash", "-c", "set -euo pipefail\n" + block["body"]]
        elif block["lang"] == "python":
            command = [sys.executable, "-c", block["body"]]
        else:
            raise AssertionError(f"{page}: a runnable block of {block['lang']}")
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
        expected = int(block["code"] or 0)
        if _arrow_abort_at_exit(done, block):
            continue  # the block ran to its end; pyarrow's threads aborted Python's exit
        assert done.returncode == expected, (
            f"{page.name}: exit {done.returncode}, not {expected}:\n{block['body']}\n"
            f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        )
        if expected:  # a refusal is one line naming the cause, never a traceback
            assert "tilestore: error:" in done.stderr and "Traceback" not in done.stderr
    if os.environ.get("TILESTORE_DOCS_PICTURES"):
        _write_pictures(page, tmp_path)


# {page: {a picture its commands make, in its folder: where the pages show it, under docs/}}
PICTURES = {
    "getting-started/first-slide.md": {
        f"out/{name}.png": f"getting-started/img/{name}.jpg"
        for name in ("plan", "map", "map-clusters", "map-gallery")
    },
    "tutorials/qc-cohort.md": {"qc/previews/inked.qc.png": "tutorials/img/qc-inked.jpg"},
}


def _write_pictures(page: Path, folder: Path) -> None:
    """The pictures a page's commands made, as the pages show them: JPEG, 900 px wide."""
    from PIL import Image

    for made, shown in PICTURES.get(str(page.relative_to(DOCS)), {}).items():
        image = Image.open(folder / made).convert("RGB")
        image.thumbnail((900, 4000))
        (DOCS / shown).parent.mkdir(parents=True, exist_ok=True)
        image.save(DOCS / shown, quality=85)


# --- in a browser --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(site):
    """The built site over HTTP (the search index is fetched by a web worker: not from file://)."""
    handler = partial(SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *args: None
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_home_search_api_how_to_and_tutorial_render_in_a_browser(browser, served, tmp_path):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(60_000)
    errors, outside = [], []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("request", lambda r: outside.append(r.url) if not r.url.startswith(served) else None)

    page.goto(f"{served}/")
    assert page.locator("h1").first.inner_text().rstrip("¶") == "tilestore"
    assert page.locator(".md-tabs__link").count() >= 5  # the sections' tabs
    page.screenshot(path=str(tmp_path / "home.png"))

    page.locator("label.md-search__icon, .md-search__input").first.click()
    # the web worker builds the index of every page first (slow on a busy 2-core CI box),
    # and a query typed before it is ready is not run again: type, as a person does (keys:
    # the search listens to them, not to a value set), once it says it is ready
    meta = page.locator(".md-search-result__meta")
    deadline = time.monotonic() + 240
    while "Initializing" in meta.inner_text() and time.monotonic() < deadline:
        page.wait_for_timeout(250)
    page.locator("input.md-search__input").press_sequentially("preemption")
    results = page.locator(".md-search-result__item")
    results.first.wait_for()
    assert results.count() >= 1
    page.screenshot(path=str(tmp_path / "search.png"))

    page.goto(f"{served}/reference/api/tilestore.embed/")
    embed = page.locator('[id="tilestore.embed.embed"]')
    embed.wait_for()
    embed.scroll_into_view_if_needed()
    assert "Embed each store" in page.locator(".doc-contents").first.inner_text() or (
        "Embed each store" in page.content()
    )
    page.screenshot(path=str(tmp_path / "api.png"))

    page.goto(f"{served}/how-to/cohort-slurm/")
    assert page.locator("h1").first.inner_text().rstrip("¶") == "A cohort under SLURM"
    assert page.locator("pre code").count() >= 3
    page.screenshot(path=str(tmp_path / "how-to.png"))

    page.goto(f"{served}/tutorials/viewer/")
    assert page.locator("h1").first.inner_text().rstrip("¶") == "The viewer"
    screenshot = page.locator('img[src$="view-pca.jpg"]')
    screenshot.scroll_into_view_if_needed()
    page.wait_for_function("[...document.images].every(i => i.complete && i.naturalWidth > 0)")
    page.wait_for_timeout(500)  # the header's title, faded to the page's as it scrolls
    page.screenshot(path=str(tmp_path / "tutorial.png"))

    page.goto(f"{served}/tutorials/01_single_slide_roi_pca/")  # a notebook, as the build ran it
    figures = page.locator('img[src^="data:image/png"]')
    assert figures.count() >= 5
    figures.nth(2).scroll_into_view_if_needed()
    page.wait_for_function("[...document.images].every(i => i.complete && i.naturalWidth > 0)")
    page.wait_for_timeout(500)
    page.screenshot(path=str(tmp_path / "notebook.png"))

    assert errors == []
    assert outside == []  # nothing fetched from elsewhere: the site works offline
    shots = ("home", "search", "api", "how-to", "tutorial", "notebook")
    for shot in shots:
        assert (tmp_path / f"{shot}.png").stat().st_size > 10_000
    if os.environ.get("TILESTORE_DOCS_SHOTS"):  # a folder to keep them in
        folder = Path(os.environ["TILESTORE_DOCS_SHOTS"])
        folder.mkdir(parents=True, exist_ok=True)
        for shot in shots:
            shutil.copy(tmp_path / f"{shot}.png", folder / f"{shot}.png")
