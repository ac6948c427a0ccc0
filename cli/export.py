"""`tilestore export ...`: generated from the library's registry (`tilestore.exports.EXPORTS`),
one subcommand per export and nothing written here per export: each subcommand's argument
(the store, or the stores) and flags come from its command function's declared options
(`with_flags`), its help from the registry's line and the function's docstring; the command
makes each output's place ready, calls the function and prints the lines it returns."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated, Any, get_args, get_origin

import typer
from rich.console import Console

from tilestore.cli.console import output_file
from tilestore.cli.flags import with_flags
from tilestore.exports import EXPORTS, Export
from tilestore.options import Opt

out = Console()


def _group_help() -> str:
    """The group's help: what the exports read, each with the exports that read it."""
    reads: dict[str, list[str]] = {}
    for export in EXPORTS:
        reads.setdefault(export.reads, []).append(export.name)
    return (
        "Out to other tools' files: "
        + "; ".join(f"{what} ({', '.join(names)})" for what, names in reads.items())
        + "."
    )


def _help(export: Export, function: Callable[..., Any]) -> str:
    """A subcommand's help: the registry's line, then the function's docstring less its
    first paragraph (what the function is), each paragraph on one line (typer keeps a
    docstring's line breaks after the first)."""
    paragraphs = (inspect.getdoc(function) or "").split("\n\n")[1:]
    return "\n\n".join([export.help, *(" ".join(p.split()) for p in paragraphs if p)])


def _argument(param: inspect.Parameter) -> inspect.Parameter:
    """The command line's argument of a command function's first parameter: one store, or
    several (a list), its help from its declaration."""
    opt = next(a for a in param.annotation.__metadata__ if isinstance(a, Opt))
    many = get_origin(get_args(param.annotation)[0]) is list
    return param.replace(
        kind=inspect.Parameter.POSITIONAL_OR_KEYWORD,
        default=typer.Argument(..., help=opt.help),
        annotation=list[str] if many else str,
    )


def build(export: Export) -> Callable[..., Any]:
    """The typer command of an export: its command function's inputs as the argument, its
    other declared options as flags; each output made ready (`output_file`) before the
    function runs, the lines it returns printed."""
    function = export.load_command()
    signature = inspect.signature(function, eval_str=True)
    first, *options = signature.parameters.values()
    outputs = {
        p.name: opt.writes
        for p in options
        if get_origin(p.annotation) is Annotated
        for opt in p.annotation.__metadata__
        if isinstance(opt, Opt) and opt.writes
    }

    def command(**given: Any) -> None:
        for name, writes in outputs.items():
            output_file(given[name], folder=writes == "folder")
        inputs = given.pop(first.name)  # as given (text: a store's URL kept whole, a glob)
        for line in function(inputs, **given).lines:
            out.print(line, highlight=False, soft_wrap=True)

    command.__name__ = command.__qualname__ = export.command
    command.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[_argument(first), *options], return_annotation=None
    )
    return with_flags(command)


export_app = typer.Typer(no_args_is_help=True, help=_group_help())
for _export in EXPORTS:
    export_app.command(
        _export.name, help=_help(_export, _export.load_command()), short_help=_export.summary
    )(build(_export))
