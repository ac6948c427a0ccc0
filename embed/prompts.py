"""Zero-shot prompts: the classes to score tiles by, each with the names a text tower reads
for it, read from a file and checked before anything loads (`read_prompts`).

The file is JSON (.json) or YAML (.yaml, .yml), in the form of CONCH's prompt files
(github.com/mahmoodlab/CONCH, prompts/): a mapping of ``classnames`` (each class: a list
of its names or synonyms) and optional ``templates`` (sentences holding ``CLASSNAME``, each
name put in its place; without templates each name is a prompt itself)::

    classnames:
      tumor: [invasive carcinoma, tumor, carcinoma]
      stroma: [stroma, fibrous stroma]
      normal: [normal tissue, benign tissue]
    templates:
      - "an H&E image of CLASSNAME."
      - "a photomicrograph showing CLASSNAME."

CONCH's own files wrap that mapping in one numbered entry (``{"0": {...}}``); they are
read as they are. A class's text embedding is the mean of its prompts' unit embeddings,
made unit again (CONCH's ``zero_shot_classifier``: every name with every template).
Class names become column names in the store (``<set>:<class>``): letters, digits,
``_``, ``-`` and ``.``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tilestore.errors import OptionError

PLACEHOLDER = "CLASSNAME"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True)
class Prompts:
    """Classes (in the file's order), each with its names; the templates they go into."""

    path: str
    classes: dict[str, tuple[str, ...]]
    templates: tuple[str, ...] = (PLACEHOLDER,)

    def texts(self, name: str) -> list[str]:
        """Every prompt of class `name`: each of its names in each template."""
        return [t.replace(PLACEHOLDER, n) for n in self.classes[name] for t in self.templates]

    @property
    def names(self) -> list[str]:
        return list(self.classes)


def read_prompts(path: str | os.PathLike) -> Prompts:
    """The prompts in `path`; OptionError (one line naming the file and what is wrong)
    where it cannot be read or does not hold at least two classes of prompts."""
    path = Path(path)
    where = f"prompts={str(path)!r}"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise OptionError(f"{where}: cannot read it ({type(exc).__name__}: {exc})") from exc
    data = _parse(text, path.suffix.lower(), where)
    if isinstance(data, dict) and len(data) == 1:  # CONCH's files: {"0": {...}}
        (only,) = data.values()
        if isinstance(only, dict) and "classnames" in only:
            data = only
    if not isinstance(data, dict) or "classnames" not in data:
        raise OptionError(f"{where}: needs a mapping with 'classnames' (class: [names...])")
    unknown = sorted(set(data) - {"classnames", "templates"})
    if unknown:
        raise OptionError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))} "
                          "(only 'classnames' and 'templates')")  # fmt: skip
    classes = _classes(data["classnames"], where)
    templates = _templates(data.get("templates", [PLACEHOLDER]), where)
    return Prompts(str(path), classes, templates)


def _parse(text: str, suffix: str, where: str) -> Any:
    if suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise OptionError(f"{where}: not JSON ({exc})") from exc
    if suffix in (".yaml", ".yml"):
        import yaml

        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise OptionError(f"{where}: not YAML ({str(exc).splitlines()[0]})") from exc
    raise OptionError(f"{where}: a .json, .yaml or .yml file, not {suffix or 'no suffix'!r}")


def _classes(found: Any, where: str) -> dict[str, tuple[str, ...]]:
    if not isinstance(found, dict) or len(found) < 2:
        raise OptionError(f"{where}: 'classnames' must map at least two classes to their names")
    classes = {}
    for name, names in found.items():
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise OptionError(
                f"{where}: class {name!r} is not a column name (letters, digits, _ - ., at "
                "most 64, starting with a letter or digit)"
            )
        if isinstance(names, str):
            names = [names]
        if not isinstance(names, list) or not names:
            raise OptionError(f"{where}: class {name!r} has no names (give a list of strings)")
        bad = [n for n in names if not isinstance(n, str) or not n.strip()]
        if bad:
            raise OptionError(f"{where}: class {name!r} has a name that is not text: {bad[0]!r}")
        classes[name] = tuple(n.strip() for n in names)
    return classes


def _templates(found: Any, where: str) -> tuple[str, ...]:
    if isinstance(found, str):
        found = [found]
    if not isinstance(found, list) or not found:
        raise OptionError(f"{where}: 'templates' must be a list of sentences holding CLASSNAME")
    for template in found:
        if not isinstance(template, str) or PLACEHOLDER not in template:
            raise OptionError(f"{where}: template {template!r} does not hold CLASSNAME")
    return tuple(found)
