"""The commands' flags, generated from the library's option declarations (`tilestore.options`).

A command names where its options are declared and gets them as flags, with their help,
range, unit and default from that one declaration:

- a parameter whose default is ``From(PlanOptions)`` becomes one flag per field of the
  record (a nested record's fields too, e.g. ``--contrast-min``), and the command is called
  with the record made from the flags given (``empty_none``: None where none was);
- ``From(convert, exclude=...)`` does the same for a library function's declared
  parameters, and the command is called with a dict of the flags given;
- a parameter annotated ``Annotated[<type>, Opt(...)]`` (e.g. `tilestore.options.Workers`) is one
  flag, and the command is called with its checked value.

A declaration's `Opt.short` adds a one-letter flag (``-o``); one without a default is a
required flag.

Every such flag is read as text and parsed by its declaration (`Declaration.parse`), so a
value outside its range, 0 where 0 means nothing, NaN or a word where a number belongs is
one `OptionError` line before the command's body runs: before anything is read, written or
loaded. A flag left out is left out of the record or dict too: the library decides its
default, once.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, get_origin

import typer

from tilestore.options import (
    REQUIRED,
    Declaration,
    Kind,
    Opt,
    declarations,
    store_written,
    written_here,
)


@dataclass(frozen=True)
class From:
    """A command parameter filled from declared options: an option record's fields or a
    library function's declared parameters (all with a `cli` declaration, less `exclude`,
    or `only` those named). empty_none: a record is None where no flag of it was given."""

    source: type | Callable[..., Any]
    exclude: tuple[str, ...] = ()
    only: tuple[str, ...] | None = None
    empty_none: bool = False


@dataclass(frozen=True)
class _Flag:
    """One generated flag: its parameter name, where its value goes (the record field's path,
    or the parameter), and its declaration."""

    name: str
    path: tuple[str, ...]
    declaration: Declaration


def with_flags(command: Callable[..., Any]) -> Callable[..., Any]:
    """The command with its declared options as flags (see the module's docstring)."""
    own = inspect.signature(command, eval_str=True)
    kept, groups, singles = [], {}, {}
    for param in own.parameters.values():
        if isinstance(param.default, From):
            groups[param.name] = (param.default, _expand(param.default.source, param.default))
        elif (single := _single(param)) is not None:
            singles[param.name] = _Flag(single.flag, (param.name,), single)
        else:
            kept.append(param)
    generated = [f for _, flags in groups.values() for f in flags] + list(singles.values())
    names = [p.name for p in kept] + [f.name for f in generated]
    if len(set(names)) != len(names):
        raise TypeError(f"{command.__name__}: two options share a flag: {sorted(names)}")

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        for name, (source, flags) in groups.items():
            kwargs[name] = _gather(source, flags, kwargs)
        for name, flag in singles.items():
            kwargs[name] = _value(flag, kwargs.pop(flag.name))
        return command(**kwargs)

    wrapper.__signature__ = own.replace(  # type: ignore[attr-defined]
        parameters=[*kept, *(_parameter(f) for f in generated)],
        return_annotation=own.return_annotation,
    )
    wrapper.__annotations__ = {
        p.name: p.annotation for p in wrapper.__signature__.parameters.values()
    }
    wrapper.flag_declarations = {f.name: f.declaration for f in generated}  # type: ignore[attr-defined]
    wrapper.flag_aliases = {  # type: ignore[attr-defined]
        f.path[-1]: f.name for f in generated if f.path[-1] != f.name
    }
    return wrapper


def _expand(source: type | Callable[..., Any], spec: From, prefix: tuple[str, ...] = ()):
    """The flags of a record's fields (nested records' fields too) or a function's
    parameters, as `spec` selects them."""
    flags = []
    for name, declaration in declarations(source).items():
        if not declaration.opt.cli or name in spec.exclude:
            continue
        if spec.only is not None and not prefix and name not in spec.only:
            continue
        if declaration.kind.record is not None:
            flags += _expand(declaration.kind.record, spec, (*prefix, name))
        else:
            flags.append(_Flag(declaration.flag, (*prefix, name), declaration))
    return flags


def _single(param: inspect.Parameter) -> Declaration | None:
    """The declaration of a parameter annotated ``Annotated[<type>, Opt(...)]``, else None."""
    if get_origin(param.annotation) is not Annotated:
        return None
    opt = next((a for a in param.annotation.__metadata__ if isinstance(a, Opt)), None)
    if opt is None:
        return None
    default = REQUIRED if param.default is inspect.Parameter.empty else param.default
    return Declaration(param.name, Kind.of(param.annotation.__origin__), opt, default)


def _gather(spec: From, flags: list[_Flag], kwargs: dict[str, Any]) -> Any:
    """The record (or dict, for a function) of the flags given."""
    given: dict[tuple[str, ...], Any] = {}
    for flag in flags:
        text = kwargs.pop(flag.name)
        if text is not None:
            given[flag.path] = _value(flag, text)
    if not isinstance(spec.source, type):  # a function's parameters: those given
        return {path[0]: value for path, value in given.items()}
    if not given and spec.empty_none:
        return None
    return _record(spec.source, given)


def _record(cls: type, given: dict[tuple[str, ...], Any]) -> Any:
    """`cls` made from the values given by field path (nested records made from theirs)."""
    fields: dict[str, Any] = {}
    nested: dict[str, dict[tuple[str, ...], Any]] = {}
    for path, value in given.items():
        if len(path) == 1:
            fields[path[0]] = value
        else:
            nested.setdefault(path[0], {})[path[1:]] = value
    for name, values in nested.items():
        fields[name] = _record(declarations(cls)[name].kind.record, values)
    return cls(**fields)


def _value(flag: _Flag, given: Any) -> Any:
    """A flag's value: its text parsed and checked (a switch's bool checked); its
    declared default where it was not given."""
    declaration = flag.declaration
    if given is None:
        return None if declaration.default is REQUIRED else declaration.default
    if isinstance(given, bool):
        return declaration.check(given)
    return declaration.parse(given)


def _parameter(flag: _Flag) -> inspect.Parameter:
    """The typer option of a flag: text (parsed by its declaration), or a switch."""
    declaration = flag.declaration
    switch = declaration.kind.switch and declaration.kind.number is None
    dashed = flag.name.replace("_", "-")
    names = [f"--{dashed}/--no-{dashed}" if switch else f"--{dashed}"]
    if declaration.opt.short:
        names.append(f"-{declaration.opt.short}")
    option = typer.Option(
        ... if declaration.default is REQUIRED else None,
        *names,
        help=help_text(declaration),
        metavar=None if switch else metavar(declaration),
        show_default=False,
    )
    return inspect.Parameter(
        flag.name,
        inspect.Parameter.KEYWORD_ONLY,
        default=option,
        annotation=bool | None if switch else str | None,
    )


def help_text(declaration: Declaration) -> str:
    """A flag's help: what it does, what it allows, its default."""
    text, kind = declaration.opt.help, declaration.kind
    if kind.number is not None or kind.items is int:  # words and shapes: in the help already
        text += f" {_capital(declaration.allowed())}."
    default = declaration.shown_default()
    if default is not None and not (declaration.kind.switch and declaration.default is False):
        text += f" Default: {default}."
    return text


def metavar(declaration: Declaration) -> str:
    """The placeholder a flag's help shows: its unit, N, or its named values."""
    opt, kind = declaration.opt, declaration.kind
    if opt.metavar:
        return opt.metavar
    if kind.number is not None:
        return opt.unit.upper() if opt.unit else ("N" if kind.number is int else "X")
    if kind.words and not (kind.text or kind.path):
        return "|".join(kind.words)
    return "PATH" if kind.path else "TEXT"


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def store_place(flag: str) -> Callable[[str], Path | str]:
    """The parser of a flag naming where stores are written (`store_written`): a local
    folder, or a bucket's URL (s3://, gs://: built here, then uploaded); an http(s) URL is
    refused in one line."""

    def path(text: str) -> Path | str:  # its name: the help's <path>, as for any path
        return store_written(text, flag)

    return path


def written(flag: str) -> Callable[[str], Path]:
    """The parser of a flag naming a path the command writes (`written_here`): a URL is
    refused in one line before any work, never taken for a local folder named "s3:"."""

    def path(text: str) -> Path:  # its name: the help's <path>, as for any path
        return written_here(text, flag)

    return path
