"""MkDocs hook: the pages and tables generated from the code at every build, never typed.

- `reference/api/<face>.md`: one page per package face (`tests/test_architecture.py`
  `FACES`), each public name (`__all__`) rendered from its docstring by mkdocstrings;
- sections of the hand-written pages, between `<!-- generated: NAME -->` and
  `<!-- end generated -->` (`SECTIONS`): the command line (every command and subcommand of
  the `tilestore` typer app, its usage, arguments and flags with their help, as click formats
  them for `--help`), the API's index, the model catalogue, the exit codes, the store
  record's fields. They are committed too, so that the Markdown reads whole where it is read
  as files (GitHub), and `python -m docs.hooks` writes them again (tests/test_docs.py fails
  when one differs from what the code makes now); the build puts in what the code makes;
- `performance/results.md`: bench/RESULTS.md as it is (kept as the source), and
  `architecture.md`: ARCHITECTURE.md as it is;
- `figures/<name>`: bench/figures, the benchmarks' and the viewer's pictures, as they are;
- the tutorial notebooks, executed (`docs/notebooks.py`): the site shows their outputs.

A page links to a source the site shows under another name (`published()`: ARCHITECTURE.md,
bench/RESULTS.md, a figure, a face's `__init__.py`) as the file it is, which resolves where
the Markdown is read as files; the hook points each such link at the page it is on the site.

Imports only light modules (the faces load members lazily, the registries are plain data,
the CLI imports no torch): the build reads the package's sources through griffe.
"""

from __future__ import annotations

import ast
import dataclasses
import html
import importlib
import importlib.util
import inspect
import os
import posixpath
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from docs import links, notebooks  # noqa: E402
from docs.griffe_folders import escape_placeholders, folders  # noqa: E402  (one rule for both)

MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)
END = "<!-- end generated -->"
SECTION = re.compile(
    r"^<!-- generated: (?P<name>[a-z-]+) -->\n(?P<body>.*?)^<!-- end generated -->$",
    re.MULTILINE | re.DOTALL,
)
DOCS = ROOT / "docs"


def faces() -> tuple[str, ...]:
    """The package faces, as the architecture test lists them (one list, kept there)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module("tests.test_architecture").FACES


def public_names(face: str) -> list[str]:
    return list(importlib.import_module(face).__all__)


# --- API ---------------------------------------------------------------------------------


API_INDEX = "reference/api/index.md"


def api_path(face: str) -> str:
    return f"reference/api/{face}.md"


def as_markdown(docstring: str) -> str:
    """A docstring as markdown: its `>>>` lines (and their `...` continuations) fenced, its
    `<name>` placeholders shown (not taken as HTML tags)."""
    lines, out, fenced = inspect.cleandoc(docstring).splitlines(), [], False
    for line in lines:
        example = line.startswith((">>>", "..."))
        if example != fenced:
            out.append("```pycon" if example else "```")
            fenced = example
        out.append(line)
    if fenced:
        out.append("```")
    return escape_placeholders("\n".join(out))


def api_page(face: str) -> str:
    module = importlib.import_module(face)
    parts = [f"# `{face}`", "", as_markdown(module.__doc__ or ""), ""]
    parts.append(f"Public names: {len(public_names(face))} (its `__all__`).")
    for name in public_names(face):
        parts += ["", f"::: {face}.{name}", "    options:", "      heading_level: 2"]
    return "\n".join(parts) + "\n"


def face_source(face: str) -> str:
    """A face's module file, from the repository's root, where pyproject's package-dir puts
    it (`tilestore.embed` is `embed/__init__.py`)."""
    mapped = {name: path.relative_to(ROOT).as_posix() for name, path in folders().items()}
    parts = face.split(".")
    heads = [i for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in mapped]
    folder = (
        posixpath.join(mapped[".".join(parts[: heads[0]])], *parts[heads[0] :])
        if heads
        else posixpath.join(*parts)
    )
    return f"{folder}/__init__.py" if (ROOT / folder / "__init__.py").is_file() else f"{folder}.py"


def api_index() -> str:
    """The API index's section: each face linked as its module file (on the site: its page)."""
    here = posixpath.dirname(f"docs/{API_INDEX}")
    rows = ["| face | public names | what |", "|---|---|---|"]
    for face in faces():
        doc = (importlib.import_module(face).__doc__ or "").strip().split("\n\n")[0]
        summary = " ".join(doc.split()).replace("|", "\\|")
        source = posixpath.relpath(face_source(face), here)
        rows.append(f"| [`{face}`]({source}) | {len(public_names(face))} | {summary} |")
    total = sum(len(public_names(f)) for f in faces())
    return f"{total} names in {len(faces())} faces.\n\n" + "\n".join(rows)


# --- CLI ---------------------------------------------------------------------------------


def cli_commands() -> Iterator[tuple[list[str], object, object]]:
    """(words, click command, its context) for `tilestore` and every (sub)command, in the
    order `--help` lists them."""
    import typer.main

    from tilestore.cli.main import app

    def walk(command, words, parent):
        ctx = command.context_class(command, info_name=words[-1], parent=parent)
        yield words, command, ctx
        for name, sub in getattr(command, "commands", {}).items():
            if not sub.hidden:
                yield from walk(sub, [*words, name], ctx)

    yield from walk(typer.main.get_command(app), ["tilestore"], None)


def cli_anchor(words: list[str]) -> str:
    return "-".join(words)


def _cell(text: str) -> str:
    """Text as one table cell: one line, its pipes escaped, `<word>` shown, not taken as HTML."""
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;")


def _code(text: str) -> str:
    """Text as a code span in a table cell, shown as it is on the site and on GitHub: where
    it holds a `|`, which GitHub takes for the cell's end even in a code span (and
    Python-Markdown shows escaped as `\\|`), a `<code>` element with its characters as
    entities."""
    text = " ".join(text.split())
    if "|" not in text:
        return f"`{text}`"
    shown = "".join(f"&#{ord(c)};" if c in "|*_[]`\\" else c for c in html.escape(text, False))
    return f"<code>{shown}</code>"


def cli_page() -> str:
    """The command line page's section: a heading per command, whose anchor (GitHub's, and
    the site's: `links.slug`) is `cli_anchor` of its words."""
    parts = []
    for words, command, ctx in cli_commands():
        level = "#" * min(len(words) + 1, 4)
        usage = " ".join([*words, *command.collect_usage_pieces(ctx)])
        heading = f"`{' '.join(words)}`"
        if links.slug(heading) != cli_anchor(words):
            raise ValueError(f"the heading {heading} would not be anchored #{cli_anchor(words)}")
        parts += ["", f"{level} {heading}", ""]
        parts += [as_markdown(command.help or ""), "", "```text", usage, "```"]
        records = [p.get_help_record(ctx) for p in command.params]
        records = [r for r in records if r]
        if records:
            parts += ["", "| argument or flag | help |", "|---|---|"]
            parts += [f"| {_code(flag)} | {_cell(help_)} |" for flag, help_ in records]
        subs = [n for n, s in getattr(command, "commands", {}).items() if not s.hidden]
        if subs:
            links_ = ", ".join(f"[`{n}`](#{cli_anchor([*words, n])})" for n in subs)
            parts += ["", f"Commands: {links_}."]
    return "\n".join(parts[1:])


# --- tables put into hand-written pages --------------------------------------------------


def _num(value) -> str:
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def models_table() -> str:
    from tilestore.embed import list_models

    rows = [
        "| name | weights (hub id) | code | dim | input px | um/px | tile px | pooling "
        "| precision | licence | gated | checked against | zero-shot |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for spec in list_models():
        size = spec.data.get("input_size", (None, spec.tile, spec.tile))[1:]
        hub = f"[`{spec.repo}`]({spec.card})" if spec.card else f"`{spec.repo}` ({spec.source})"
        rows.append(
            f"| `{spec.name}` | {hub} | {spec.code} | {_num(spec.output_dim)} "
            f"| {'x'.join(map(str, size))} "
            f"| {_num(spec.native_mpp)} | {spec.tile} | {spec.pooling} | {spec.precision} "
            f"| {_cell(spec.licence or '-')} | {'yes' if spec.gated else 'no'} "
            f"| {_cell(spec.reference or '-')} | {spec.text or '-'} |"
        )
    return "\n".join(rows)


def slide_encoders_table() -> str:
    from tilestore.embed.slides import list_slide_encoders

    rows = [
        "| name | tile model | um/px | tile px | dim | tiles as | weights | licence | gated "
        "| checked against | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for spec in list_slide_encoders():
        weights = spec.repo or spec.weights_file or spec.source
        weights = f"[`{weights}`]({spec.card})" if spec.card else f"`{weights}`"
        rows.append(
            f"| `{spec.name}` | {_num(spec.tile_model)} | {_num(spec.mpp)} | {_num(spec.tile)} "
            f"| {_num(spec.output_dim) if spec.output_dim else 'as the tiles'} | {spec.coords} "
            f"| {weights} | {_cell(spec.licence or '-')} | {'yes' if spec.gated else 'no'} "
            f"| {_cell(spec.reference or '-')} | {_cell(spec.note or '')} |"
        )
    return "\n".join(rows)


def _codes(text: str) -> list[tuple[int, str]]:
    """(status, meaning) from a docstring's lines `  N  meaning` (continued indented)."""
    found: list[tuple[int, str]] = []
    for line in text.splitlines():
        start = re.match(r"^\s{1,4}(\d+)\s{2,}(.*)$", line)
        if start:
            found.append((int(start[1]), start[2]))
        elif found and line.startswith("     ") and line.strip():
            found[-1] = (found[-1][0], f"{found[-1][1]} {line.strip()}")
        elif found and not line.strip():
            break
    return found


def exit_codes_embed() -> str:
    outcome = importlib.import_module("tilestore.embed.outcome")
    codes = _codes(outcome.__doc__ or "")
    stated = {outcome.DONE, outcome.FAILED, outcome.SOME_FAILED, outcome.BAD_INPUT}
    stated |= {outcome.interrupted_code(name) for name in outcome.SIGNALS}
    if {code for code, _ in codes} != stated:  # the docstring and the constants disagree
        raise ValueError(f"embed/outcome.py's docstring lists {codes}, its constants {stated}")
    rows = [
        "| exit | outcome (the report's) | `tilestore embed`, an array task, `embed_cohort`'s "
        "`exit_code` |",
        "|---|---|---|",
    ]
    for code, text in codes:
        word, meaning = text.split(": ", 1)
        if word not in (outcome.outcome(code), "damaged input"):
            raise ValueError(f"embed/outcome.py: {code} is {outcome.outcome(code)!r}, not {word!r}")
        rows.append(f"| {code} | {word} | {_cell(meaning)} |")
    return "\n".join(rows)


def exit_codes_status() -> str:
    status = importlib.import_module("tilestore.cli.status")
    doc = " ".join((status.__doc__ or "").split())
    listed = re.search(r"Exit codes: (.*?)(?:\.$|\.\s)", doc)
    if not listed:
        raise ValueError("cli/status.py's docstring no longer says 'Exit codes: ...'")
    codes = [re.match(r"(\d+) (.*)", part.strip()) for part in listed[1].split(";")]
    rows = ["| exit | `tilestore status` |", "|---|---|"]
    return "\n".join(rows + [f"| {m[1]} | {_cell(m[2])} |" for m in codes])


def record_fields(module: str) -> str:
    """A table per dataclass of a module: field, type, default, the comment beside it."""
    source = inspect.getsource(importlib.import_module(module))
    lines, tree = source.splitlines(), ast.parse(source)
    mod = importlib.import_module(module)
    parts = []
    for node in tree.body:
        cls = getattr(mod, getattr(node, "name", ""), None)
        if not (isinstance(node, ast.ClassDef) and dataclasses.is_dataclass(cls)):
            continue
        doc = " ".join((cls.__doc__ or "").split())
        parts += [f"### `{cls.__name__}`", "", doc, "", "| field | type | default | note |"]
        parts.append("|---|---|---|---|")
        for item in node.body:
            if (
                isinstance(item, ast.AnnAssign)
                and isinstance(item.target, ast.Name)
                and "ClassVar" not in ast.get_source_segment(source, item.annotation)
            ):
                line = lines[item.end_lineno - 1]
                note = line.split("#", 1)[1].strip() if "#" in line else ""
                default = ast.get_source_segment(source, item.value) if item.value else "-"
                kind = ast.get_source_segment(source, item.annotation)
                parts.append(
                    f"| `{item.target.id}` | {_code(kind)} | {_code(default)} | {_cell(note)} |"
                )
        parts.append("")
    return "\n".join(parts)


def module_docstring(module: str) -> Callable[[], str]:
    return lambda: as_markdown(importlib.import_module(module).__doc__ or "")


SECTIONS: dict[str, Callable[[], str]] = {
    "cli": cli_page,
    "api": api_index,
    "models": models_table,
    "slide-encoders": slide_encoders_table,
    "exit-codes-embed": exit_codes_embed,
    "exit-codes-status": exit_codes_status,
    "store-record": lambda: record_fields("tilestore.format.record"),
    "group-records": lambda: record_fields("tilestore.format.records"),
    "embeddings-layout": module_docstring("tilestore.embeddings.layout"),
}


def filled(markdown: str, where: str, *, markers: bool) -> str:
    """A page with each generated section made from the code now: between its markers, as
    committed (`markers`), or in their place, as the site shows it."""

    def fill(match: re.Match) -> str:
        if match["name"] not in SECTIONS:
            raise ValueError(f"{where}: no generated section {match['name']!r} (hooks.SECTIONS)")
        body = SECTIONS[match["name"]]().strip("\n")
        return f"<!-- generated: {match['name']} -->\n{body}\n{END}" if markers else body

    rest = SECTION.sub("", markdown)
    if MARKER.search(rest) or re.search(f"^{END}$", rest, re.MULTILINE):
        raise ValueError(f"{where}: a '<!-- generated: NAME -->' and its '{END}' not in pairs")
    return SECTION.sub(fill, markdown)


def write_sections() -> list[Path]:
    """Writes each page's generated sections as the code makes them now; the pages changed."""
    changed = []
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text()
        made = filled(text, str(page.relative_to(ROOT)), markers=True)
        if made != text:
            page.write_text(made)
            changed.append(page)
    return changed


# --- what the site shows under another name --------------------------------------------------


def copies() -> dict[str, str]:
    """{a file of the repository, from its root: its copy on the site, under docs/}."""
    shown = {"ARCHITECTURE.md": "architecture.md", "bench/RESULTS.md": "performance/results.md"}
    folder = ROOT / "bench" / "figures"
    shown |= {
        f"bench/figures/{p.name}": f"figures/{p.name}"
        for p in sorted(folder.iterdir())
        if p.is_file()
    }
    return shown


def published() -> dict[str, str]:
    """{a file of the repository: the page or file that shows it on the site}: the copies,
    and each face's module file, whose page the API renders from it."""
    return copies() | {face_source(face): api_path(face) for face in faces()}


def site_links(markdown: str, source: str, page: str) -> str:
    """A page's Markdown with each relative link, written from `source` (the page's file in
    the repository, from the root) to a file of the repository, pointed at where the site
    shows that file (`page`: the page's path under docs/). A link to a file the site does not
    have is left as written: the strict build says it is not found."""
    shown = published()

    def move(target: str) -> str:
        parts = urlsplit(target)
        file = posixpath.normpath(posixpath.join(posixpath.dirname(source), unquote(parts.path)))
        if file in shown:
            there = shown[file]
        elif file.startswith("docs/") and not source.startswith("docs/"):
            there = file.removeprefix("docs/")
        else:
            return target
        moved = quote(posixpath.relpath(there, posixpath.dirname(page) or "."))
        return moved + (f"#{parts.fragment}" if parts.fragment else "")

    return links.rewrite(markdown, move)


# --- the hook's events ---------------------------------------------------------------------


def pages() -> dict[str, str]:
    """{page under docs/: its markdown} of the pages made whole from the code."""
    made = {api_path(face): api_page(face) for face in faces()}
    return made


def executed(files: Files, config) -> Files:
    """The notebooks among `files` replaced by their executed copies, in a folder of the
    system's temporary files that `on_post_build` removes (a file of a folder, not a generated
    one: mkdocs-jupyter reads a notebook from its `abs_src_path`)."""
    sources = [f for f in files if f.src_uri.endswith(".ipynb")]
    if not sources or not notebooks.enabled():
        return files
    data = notebooks.data_folder()
    folder = tempfile.TemporaryDirectory(prefix=f"tilestore-docs-notebooks-{os.getpid()}-")
    config["tilestore_notebooks"] = folder
    shown = Path(folder.name) / "notebooks"
    for source in sources:
        work = Path(folder.name) / "runs" / Path(source.src_uri).stem
        notebooks.execute(Path(source.abs_src_path), work, shown / source.src_uri, data)
        files.remove(source)
        files.append(File(source.src_uri, str(shown), config.site_dir, config.use_directory_urls))
    return files


@event_priority(100)  # before the plugins' on_files see the files
def on_files(files: Files, config) -> Files:
    made = {**pages(), **{site: (ROOT / file).read_bytes() for file, site in copies().items()}}
    for path, content in made.items():
        files.append(File.generated(config, path, content=content))
    return executed(files, config)


def on_post_build(config) -> None:
    if folder := config.get("tilestore_notebooks"):
        folder.cleanup()


def on_build_error(error) -> None:
    """A failed build leaves no executed notebooks behind either (this process's: the
    folder's finaliser would, at exit, with a warning)."""
    for folder in Path(tempfile.gettempdir()).glob(f"tilestore-docs-notebooks-{os.getpid()}-*"):
        shutil.rmtree(folder, ignore_errors=True)


def on_page_markdown(markdown: str, page, config, files) -> str:
    where = page.file.src_uri
    source = {site: file for file, site in copies().items()}.get(where, f"docs/{where}")
    return site_links(filled(markdown, where, markers=False), source, where)


def on_config(config):
    """The API section of the nav: its index, then one page per face."""
    for section in config["nav"]:
        for entry in section.values() if isinstance(section, dict) else ():
            for i, item in enumerate(entry if isinstance(entry, list) else ()):
                if item == {"API": "reference/api/index.md"}:
                    faces_nav = [{face: api_path(face)} for face in faces()]
                    entry[i] = {"API": ["reference/api/index.md", *faces_nav]}
    return config


if __name__ == "__main__":  # python -m docs.hooks: the committed sections made again
    for written in write_sections():
        print(f"wrote {written.relative_to(ROOT)}")
