"""Options declared once: name, type, unit, allowed range, named values, default and help.

An option is a parameter or a frozen-dataclass field annotated ``Annotated[<type>, Opt(...)]``:
the type says what kind of value it takes (``int``, ``float``, ``bool``, ``str``, a ``Literal``
of named values such as ``"level0"`` or ``"auto"``, ``tuple[str, ...]``, a path), the `Opt` its
help, unit and range. From that one declaration:

- an option record (a dataclass deriving from `Declared`) checks every field when it is made,
  so ``PlanOptions(tile=0)`` is refused where it is written, by the library and the command
  alike;
- a function decorated with `checked` checks its declared parameters at each call;
- the command's flags are generated (`tilestore.cli.flags`): their help, range and default
  come from here, and the text a user types is parsed (`parse`) and checked the same way.

A refusal is one `OptionError` line naming the option, the value and what is allowed
(``tile=0: a whole number of px from 8 to 16384``); the command puts it in its flags' terms.
A sentinel is a named value (``mpp="level0"``, ``tokens="model"``), never a number that
happens to be 0. Light: no numpy, no zarr (the command reads these before anything heavy).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import os
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

from tilestore.errors import OptionError
from tilestore.urls import (
    is_url,
    named,
    redacted,
    store_changed,
    store_read,
    store_written,
    written_here,
)

__all__ = [
    "REQUIRED",
    "Declaration",
    "Declared",
    "Device",
    "Kind",
    "Opt",
    "OptionError",
    "Workers",
    "allowed",
    "check",
    "checked",
    "declarations",
    "is_url",
    "named",
    "parse",
    "redacted",
    "store_changed",
    "store_read",
    "store_written",
    "written_here",
]


@dataclass(frozen=True)
class Opt:
    """How an option is declared, besides its type and default.

    help: what it does, one sentence. unit: of a number ("px", "um/px"). low, high: the
    range, inclusive (``above=True``: low excluded). none: what None means, for the help
    ("the model's"); none_word: the word a command line says for None where None is not
    the default ("auto", "none"). flag: the command's flag where it is not the name
    (a nested record's field: "contrast_min"). metavar: the placeholder in the help.
    cli: False for options a command does not take (objects, per-detector parameters).
    pattern: text must match this regular expression whole; shape: what it allows, said.
    multiple: a whole number must be a multiple of this. short: the command's one-letter
    flag besides the long one ("o" for -o). writes: a path the command writes, a "file" or
    a "folder", made ready (its folder made, or refused in one line) before any work.
    """

    help: str
    unit: str = ""
    low: float | None = None
    high: float | None = None
    above: bool = False
    none: str = ""
    none_word: str | None = None
    flag: str | None = None
    metavar: str | None = None
    cli: bool = True
    pattern: str | None = None
    shape: str = ""
    multiple: int | None = None
    short: str | None = None
    writes: Literal["", "file", "folder"] = ""


@dataclass(frozen=True)
class Kind:
    """What values an option's type admits (from its annotation)."""

    number: type | None = None  # int or float
    words: tuple[str, ...] = ()  # named values (a Literal)
    text: bool = False  # any str
    switch: bool = False  # bool
    items: type | None = None  # tuple[str, ...] or tuple[int, ...]: its items' type
    path: bool = False
    optional: bool = False  # None
    record: type | None = None  # a nested option record (also in `other`)
    other: tuple[type, ...] = ()  # objects taken as they are

    @classmethod
    def of(cls, annotation: Any) -> Kind:
        found: dict[str, Any] = {"words": (), "other": ()}
        for arg in _union(annotation):
            if arg is type(None):
                found["optional"] = True
            elif arg is bool:
                found["switch"] = True
            elif arg in (int, float):
                found["number"] = float if float in (arg, found.get("number")) else int
            elif arg is str:
                found["text"] = True
            elif get_origin(arg) is Literal:
                found["words"] += tuple(str(a) for a in get_args(arg))
            elif get_origin(arg) is tuple:
                found["items"] = get_args(arg)[0]
            elif arg in (Path, os.PathLike) or get_origin(arg) is os.PathLike:
                found["path"] = True
            elif isinstance(arg, type) and issubclass(arg, Declared):
                found["record"] = arg
                found["other"] += (arg,)
            else:
                found["other"] += (get_origin(arg) or arg,)
        return cls(**found)


@dataclass(frozen=True)
class Declaration:
    """One declared option: its name, kind, `Opt` and default (`REQUIRED` where none)."""

    name: str
    kind: Kind
    opt: Opt
    default: Any

    @property
    def flag(self) -> str:
        return self.opt.flag or self.name

    def check(self, value: Any) -> Any:
        """`value` as the option keeps it (a list as a tuple, a whole float as an int);
        OptionError where it is not allowed."""
        return check(self.name, value, self.kind, self.opt)

    def parse(self, text: str) -> Any:
        """The value a command line's `text` gives this option, checked."""
        return parse(self.name, text, self.kind, self.opt)

    def allowed(self) -> str:
        return allowed(self.kind, self.opt)

    def shown_default(self) -> str | None:
        """The default as the help shows it (None: nothing to show)."""
        if self.default is REQUIRED:
            return None
        if self.default is None:
            return self.opt.none or None
        if isinstance(self.default, tuple):
            return ",".join(map(str, self.default))
        if isinstance(self.default, float):
            return f"{self.default:g}"
        return str(self.default)


REQUIRED = inspect.Parameter.empty


class Declared:
    """Base of option records (frozen dataclasses of annotated fields): each field is checked
    when the record is made, and kept as `check` returns it."""

    def __post_init__(self) -> None:
        for name, declaration in declarations(type(self)).items():
            value = getattr(self, name)
            kept = declaration.check(value)
            if kept is not value:
                object.__setattr__(self, name, kept)


@functools.cache
def declarations(owner: type | Callable[..., Any]) -> dict[str, Declaration]:
    """The declared options of an option record's fields, or of a function's parameters."""
    hints = typing.get_type_hints(owner, include_extras=True)
    if dataclasses.is_dataclass(owner):
        defaults = {f.name: _field_default(f) for f in dataclasses.fields(owner)}
    else:
        defaults = {name: p.default for name, p in inspect.signature(owner).parameters.items()}
    found = {}
    for name, hint in hints.items():
        if name not in defaults or get_origin(hint) is not Annotated:
            continue
        opt = next((a for a in hint.__metadata__ if isinstance(a, Opt)), None)
        if opt is not None:
            found[name] = Declaration(name, Kind.of(hint.__origin__), opt, defaults[name])
    return found


def _field_default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return REQUIRED


def checked(function: Callable[..., Any]) -> Callable[..., Any]:
    """The function, checking its declared parameters (``Annotated[..., Opt]``) at each call."""
    signature = inspect.signature(function)

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        for name, declaration in declarations(function).items():
            if name in bound.arguments:
                bound.arguments[name] = declaration.check(bound.arguments[name])
        return function(*bound.args, **bound.kwargs)

    return wrapper


def check(name: str, value: Any, kind: Kind, opt: Opt) -> Any:
    """`value` as kept (see `Declaration.check`), or OptionError naming `name`."""
    if opt.writes and isinstance(value, str):  # a URL refused, never a local folder "s3:"
        value = written_here(value, f"{name}=")  # (file://: its path)
    if value is None or (isinstance(value, str) and value == opt.none_word):
        if kind.optional:
            return None
    elif isinstance(value, bool) or _is_numpy_bool(value):
        if kind.switch:
            return bool(value)
    elif isinstance(value, str):
        if value in kind.words:
            return value
        if (
            value.strip()
            and (kind.path or kind.text)
            and (opt.pattern is None or re.fullmatch(opt.pattern, value))
        ):
            return value
    elif isinstance(value, os.PathLike):
        if kind.path:
            return value
    elif kind.number is not None and _is_number(value):
        return _in_range(name, value, kind, opt)
    elif kind.items is str and isinstance(value, list | tuple):
        if all(isinstance(v, str) for v in value):
            return tuple(value)
    elif kind.items is int and isinstance(value, list | tuple) and value:
        if all(_is_number(v) and not isinstance(v, bool) for v in value):
            return tuple(_in_range(name, v, Kind(number=int), opt) for v in value)
    elif isinstance(value, kind.other):
        return value
    raise OptionError(f"{name}={_shown(value)}: must be {allowed(kind, opt)}")


def parse(name: str, text: str, kind: Kind, opt: Opt) -> Any:
    """The value `text` (as typed on a command line) gives an option, checked."""
    text = text.strip()
    if text in kind.words:
        return text
    if opt.none_word is not None and text == opt.none_word:
        return check(name, None, kind, opt)
    if kind.number is not None:
        try:
            value = float(text) if kind.number is float else int(text)
        except ValueError:
            if not (kind.text or kind.path):
                raise OptionError(f"{name}={text!r}: must be {allowed(kind, opt)}") from None
        else:
            return check(name, value, kind, opt)
    if kind.items is not None:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if kind.items is int:
            try:
                items = [int(t) for t in items]
            except ValueError:
                raise OptionError(f"{name}={text!r}: must be {allowed(kind, opt)}") from None
        return check(name, tuple(items), kind, opt)
    if kind.path and not kind.text:
        return check(name, written_here(text, f"{name}=") if opt.writes else Path(text), kind, opt)
    return check(name, text, kind, opt)


def allowed(kind: Kind, opt: Opt) -> str:
    """What an option allows, as a phrase: "a whole number of px from 8 to 16384"."""
    parts = []
    if kind.number is not None:
        number = "a whole number" if kind.number is int else "a number"
        if opt.unit:
            number += f" of {opt.unit}"
        parts.append(
            number + _range(opt) + (f", a multiple of {opt.multiple}" if opt.multiple else "")
        )
    if kind.switch:
        parts.append("True or False")
    if kind.path:
        parts.append("a path")
    elif kind.text:
        parts.append(opt.shape or "text, not empty")
    if kind.items is str:
        parts.append("names separated by commas")
    if kind.items is int:
        parts.append(f"whole numbers{_range(opt)} separated by commas")
    if kind.record is not None:
        parts.append(f"a {kind.record.__name__}")
    words = [repr(w) for w in kind.words]
    if opt.none_word is not None:
        words.append(repr(opt.none_word))
    if words and not parts:
        return words[0] if len(words) == 1 else "one of " + ", ".join(words)
    parts += words
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + ", or " + parts[-1]


def _range(opt: Opt) -> str:
    low, high = _g(opt.low), _g(opt.high)
    if opt.low is not None and opt.high is not None:
        return f" above {low} and at most {high}" if opt.above else f" from {low} to {high}"
    if opt.low is not None:
        return f" above {low}" if opt.above else f" of at least {low}"
    if opt.high is not None:
        return f" of at most {high}"
    return ""


def _in_range(name: str, value: Any, kind: Kind, opt: Opt) -> int | float:
    """A number kept as its kind (a whole float as an int), if finite and in range."""
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float
        number = math.inf
    whole = kind.number is not int or (math.isfinite(number) and number == int(number))
    low_ok = opt.low is None or (number > opt.low if opt.above else number >= opt.low)
    high_ok = opt.high is None or number <= opt.high
    step_ok = opt.multiple is None or (
        whole and math.isfinite(number) and number % opt.multiple == 0
    )
    if not (math.isfinite(number) and whole and low_ok and high_ok and step_ok):
        raise OptionError(f"{name}={_shown(value)}: must be {allowed(kind, opt)}")
    return int(value) if kind.number is int else float(value)


def _is_number(value: Any) -> bool:
    """int, float and numpy's scalars (a value read from an array), not a bool of either."""
    if isinstance(value, bool) or _is_numpy_bool(value):
        return False
    if isinstance(value, int | float):
        return True
    return type(value).__module__ == "numpy" and hasattr(value, "dtype") and value.ndim == 0


def _is_numpy_bool(value: Any) -> bool:
    kind = getattr(getattr(value, "dtype", None), "kind", "")
    return type(value).__module__ == "numpy" and kind == "b"


def _union(annotation: Any) -> tuple[Any, ...]:
    if get_origin(annotation) in (typing.Union, types.UnionType):
        return get_args(annotation)
    return (annotation,)


def _g(number: float | None) -> str:
    """A range's end as people read it: 8, 0.5, 1,000,000,000 (never 1e+09)."""
    if number is None:
        return ""
    return f"{int(number):,}" if float(number).is_integer() else f"{number:g}"


def _shown(value: Any) -> str:
    """A value as a message shows it: numbers bare (nan, -0.5, 1e+30), text quoted."""
    if _is_number(value) and not isinstance(value, bool):
        kind = getattr(value, "dtype", None)
        floating = isinstance(value, float) or (kind is not None and kind.kind == "f")
        return f"{float(value):g}" if floating else str(int(value))
    if _is_numpy_bool(value):
        return str(bool(value))
    return repr(value)


# The threads (or processes) a step may use, where a user may say: `convert --workers`,
# `verify`, `reshard`, a local Dask cluster's workers.
Workers = Annotated[
    int | None,
    Opt("Threads (or processes) to use.", low=1, high=1024, none="the job's CPUs"),
]

# The torch device a step runs on, where a user may say: `qc --device`, `crossval --device`.
Device = Annotated[
    str | None,
    Opt(
        "cuda, cuda:N or cpu.",
        pattern=r"cpu|cuda(:\d+)?",
        shape="'cpu', 'cuda' or 'cuda:N'",
        none="the GPU if any",
    ),
]
