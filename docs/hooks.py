"""MkDocs hook: the pages and tables generated from the code at every build, never typed.

- `reference/api/<face>.md`: one page per package face (`tests/test_architecture.py`
  `FACES`), each public name (`__all__`) rendered from its docstring by mkdocstrings;
- `reference/cli.md`: every command and subcommand of the `tilestore` typer app, its usage,
  arguments and flags with their help, as click formats them for `--help`;
- the model catalogue, the exit codes and the store record's fields: tables put where a
  hand-written page says `<!-- generated: NAME -->` (`SECTIONS`);
- `performance/results.md`: bench/RESULTS.md as it is (kept as the source), and
  `architecture.md`: ARCHITECTURE.md as it is;
- `figures/<name>`: bench/figures, the benchmarks' and the viewer's pictures, as they are;
- the tutorial notebooks, executed (`docs/notebooks.py`): the site shows their outputs;

Imports only light modules (the faces load members lazily, the registries are plain data,
the CLI imports no torch): the build reads the package's sources through griffe.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from docs import notebooks  # noqa: E402
from docs.griffe_folders import escape_placeholders  # noqa: E402  (the one rule for both)

MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)


def faces() -> tuple[str, ...]:
    """The package faces, as the architecture test lists them (one list, kept there)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module("tests.test_architecture").FACES


def public_names(face: str) -> list[str]:
    return list(importlib.import_module(face).__all__)


# --- API ---------------------------------------------------------------------------------


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


def api_index() -> str:
    rows = ["| face | public names | what |", "|---|---|---|"]
    for face in faces():
        doc = (importlib.import_module(face).__doc__ or "").strip().split("\n\n")[0]
        summary = " ".join(doc.split()).replace("|", "\\|")
        rows.append(f"| [`{face}`]({face}.md) | {len(public_names(face))} | {summary} |")
    total = sum(len(public_names(f)) for f in faces())
    return (
        "# API\n\nEach package's `__init__` is its public face: what it lists in `__all__` is "
        "what users may import (loaded on first use). One page per face, each name rendered "
        f"from its docstring: {total} names in {len(faces())} faces.\n\n" + "\n".join(rows) + "\n"
    )


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
    """Text for a code span in a table cell (where `<` and `|` are shown as they are)."""
    return " ".join(text.split())


def cli_page() -> str:
    parts = [
        "# Command line",
        "",
        "Every command of `tilestore`, its arguments and flags with the help `--help` prints "
        "(generated from the command itself at each build).",
    ]
    for words, command, ctx in cli_commands():
        level = "#" * min(len(words) + 1, 4)
        usage = " ".join([*words, *command.collect_usage_pieces(ctx)])
        parts += ["", f"{level} `{' '.join(words)}` {{ #{cli_anchor(words)} }}", ""]
        parts += [as_markdown(command.help or ""), "", "```text", usage, "```"]
        records = [p.get_help_record(ctx) for p in command.params]
        records = [r for r in records if r]
        if records:
            parts += ["", "| argument or flag | help |", "|---|---|"]
            parts += [f"| `{_code(flag)}` | {_cell(help_)} |" for flag, help_ in records]
        subs = [n for n, s in getattr(command, "commands", {}).items() if not s.hidden]
        if subs:
            links = ", ".join(f"[`{n}`](#{cli_anchor([*words, n])})" for n in subs)
            parts += ["", f"Commands: {links}."]
    return "\n".join(parts) + "\n"


# --- tables put into hand-written pages --------------------------------------------------


def _num(value) -> str:
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def models_table() -> str:
    from tilestore.embed import list_models

    rows = [
        "| name | weights (hub id) | dim | input px | um/px | tile px | pooling | precision "
        "| licence | gated | checked against | zero-shot |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for spec in list_models():
        size = spec.data.get("input_size", (None, spec.tile, spec.tile))[1:]
        hub = f"[`{spec.repo}`]({spec.card})" if spec.card else f"`{spec.repo}` ({spec.source})"
        rows.append(
            f"| `{spec.name}` | {hub} | {_num(spec.output_dim)} | {'x'.join(map(str, size))} "
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
    stated = {outcome.DONE, outcome.FAILED, outcome.SOME_FAILED}
    if {code for code, _ in codes} != stated:  # the docstring and the constants disagree
        raise ValueError(f"embed/outcome.py's docstring lists {codes}, its constants {stated}")
    rows = [
        "| exit | `tilestore embed`, an array task, `embed_cohort`'s `exit_code` |",
        "|---|---|",
    ]
    return "\n".join(rows + [f"| {code} | {_cell(text)} |" for code, text in codes])


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
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                line = lines[item.end_lineno - 1]
                note = line.split("#", 1)[1].strip() if "#" in line else ""
                default = ast.get_source_segment(source, item.value) if item.value else "-"
                kind = ast.get_source_segment(source, item.annotation)
                parts.append(
                    f"| `{item.target.id}` | `{_code(kind)}` | `{_code(default)}` | {_cell(note)} |"
                )
        parts.append("")
    return "\n".join(parts)


def module_docstring(module: str) -> Callable[[], str]:
    return lambda: as_markdown(importlib.import_module(module).__doc__ or "")


SECTIONS: dict[str, Callable[[], str]] = {
    "models": models_table,
    "slide-encoders": slide_encoders_table,
    "exit-codes-embed": exit_codes_embed,
    "exit-codes-status": exit_codes_status,
    "store-record": lambda: record_fields("tilestore.format.record"),
    "embeddings-layout": module_docstring("tilestore.embeddings.layout"),
}


# --- the hook's events ---------------------------------------------------------------------


def pages() -> dict[str, str]:
    """{page under docs/: its markdown} of the pages made whole from the code."""
    made = {api_path(face): api_page(face) for face in faces()}
    made["reference/api/index.md"] = api_index()
    made["reference/cli.md"] = cli_page()
    made["performance/results.md"] = (ROOT / "bench" / "RESULTS.md").read_text()
    made["architecture.md"] = (ROOT / "ARCHITECTURE.md").read_text()
    return made


def figures() -> dict[str, bytes]:
    """{figures/<name>: its bytes} of bench/figures (the pages show them where they are)."""
    folder = ROOT / "bench" / "figures"
    return {f"figures/{p.name}": p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


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
    for path, content in {**pages(), **figures()}.items():
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
    def generated(match: re.Match) -> str:
        if match[1] not in SECTIONS:
            raise ValueError(f"{page.file.src_path}: no generated section {match[1]!r}")
        return SECTIONS[match[1]]()

    return MARKER.sub(generated, markdown)


def on_config(config):
    """The API section of the nav: its index, then one page per face."""
    for section in config["nav"]:
        for entry in section.values() if isinstance(section, dict) else ():
            for i, item in enumerate(entry if isinstance(entry, list) else ()):
                if item == {"API": "reference/api/index.md"}:
                    faces_nav = [{face: api_path(face)} for face in faces()]
                    entry[i] = {"API": ["reference/api/index.md", *faces_nav]}
    return config
