"""Griffe extensions: tilestore's source as an installed tilestore has it, read statically.

- `PackageFolders`: the packages that install from folders of their own (pyproject's
  `[tool.setuptools] package-dir`: `embed/` as `tilestore.embed`, `cli/` as
  `tilestore.cli`), read where they are and hung under `tilestore`; griffe finds
  `tilestore/` alone, and `::: tilestore.embed.embed` would name a module not there.
- `LazyFaces`: a face made by `tilestore.faces.lazy_face(__name__, {module: names})` gets
  each name as an alias of where it is defined, and `__all__` from the same table, as the
  face's `__getattr__` and `__all__` have them at run time.
- `Placeholders`: a docstring's `<name>` (`embeddings/<model>`, `timm:<arch>`) shown as
  written: Markdown passes `<word>` through as an HTML tag, which a browser hides. Code
  spans and fenced blocks are left as they are (Markdown escapes those itself).
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import griffe

ROOT = Path(__file__).resolve().parents[1]


def folders() -> dict[str, Path]:
    """{dotted package: its folder} for each package that installs from another folder."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping = project["tool"]["setuptools"]["package-dir"]
    return {name: ROOT / path for name, path in mapping.items() if name != path}


class PackageFolders(griffe.Extension):
    """Loads each mapped folder as the submodule its dotted name says."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs) -> None:
        for dotted, folder in folders().items():
            top, _, name = dotted.rpartition(".")
            if top != pkg.name:
                continue
            # griffe's own way to load a module under a parent (its loader does this for
            # every submodule it finds in the parent's folder)
            module = loader._load_module(name, folder / "__init__.py", parent=pkg)
            pkg.set_member(name, module)


class LazyFaces(griffe.Extension):
    """Reads a face's `lazy_face` table: its names, each an alias of its module's."""

    def on_module_members(self, *, node: ast.AST, mod: griffe.Module, **kwargs) -> None:
        table = _lazy_table(node) if isinstance(node, ast.Module) else None
        if table is None:
            return
        for module, names in table.items():
            for name in names:
                mod.set_member(name, griffe.Alias(name, f"{module}.{name}", parent=mod))
        mod.exports = sorted(name for names in table.values() for name in names)


def _lazy_table(tree: ast.Module) -> dict[str, list[str]] | None:
    """{module: names} of a module's `... = lazy_face(__name__, {...})`, or None."""
    for statement in tree.body:
        call = statement.value if isinstance(statement, ast.Assign) else None
        if (
            isinstance(call, ast.Call)
            and getattr(call.func, "id", None) == "lazy_face"
            and len(call.args) == 2
        ):
            table = ast.literal_eval(call.args[1])
            return {module: list(names) for module, names in table.items()}
    return None


# a code span (`...`, ``...``) or a fenced block, kept whole; else a `<` that opens a tag
_CODE_OR_TAG = re.compile(r"(?P<code>```.*?```|(?P<ticks>`+).*?(?P=ticks))|<(?=[A-Za-z/!?])", re.S)


def escape_placeholders(text: str) -> str:
    """Markdown text with every `<` that would open an HTML tag, outside code, as `&lt;`."""
    return _CODE_OR_TAG.sub(lambda m: m["code"] or "&lt;", text)


class Placeholders(griffe.Extension):
    """Escapes each docstring's would-be HTML tags once griffe has read it."""

    def on_object(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = escape_placeholders(obj.docstring.value)
