"""The docs' blocks that are shown, not run (a GPU, a SLURM cluster, a user's own files),
checked against what they name, so a renamed command, flag, value, function or parameter
fails the suite as a broken run would:

- a `tilestore ...` command (also after `srun ...` or `sbatch ...`): its subcommands exist and
  the CLI's own parser accepts its flags and their values (the typer app, as it parses a
  command line, then each declared flag's text parsed by its declaration as the command
  does before its body: a renamed flag, a value out of its range or choices, a word where a
  number belongs, a missing argument fail);
- `python bench/NAME.py --flag`: the script exists and defines each flag;
- a Python block: it compiles, each import resolves (module and names), each attribute taken
  from an imported name exists, and each call of an imported callable binds to its signature
  (its positional count and keyword names).

`check_bash` and `check_python` return what they checked, one line each, and raise
AssertionError naming the block's line on the first mismatch.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import shlex
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_ENDS = {"|", "||", "&&", ";", ">", ">>", "2>", "&", "2>&1"}
# what a shown command's shell variables hold where it runs (a SLURM array's first task)
_SHELL = {"SLURM_ARRAY_TASK_ID": "0", "HOME": "/home/user", "TMPDIR": "/tmp",
          "SLURM_JOB_ID": "4712", "pid": "4711", "code": "138"}  # fmt: skip


def _lines(body: str) -> list[str]:
    """Shell lines with their `\\` continuations joined."""
    return body.replace("\\\n", " ").splitlines()


def _words(line: str) -> list[str]:
    line = re.sub(r"\$\{?(\w+)(?::-[^}]*)?\}?", lambda m: _SHELL[m[1]], line)
    lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;<>")
    lexer.whitespace_split, lexer.commenters = True, "#"
    return list(lexer)


def _tilestore(words: list[str]) -> list[str] | None:
    """The arguments of the `tilestore` command in a line's words, up to a pipe or redirect."""
    if "tilestore" not in words:
        return None
    args = words[words.index("tilestore") + 1 :]
    cut = next((i for i, w in enumerate(args) if w in _ENDS), len(args))
    return args[:cut]


def parse_cli(args: list[str]) -> str:
    """`args` parsed by the tilestore app's own parser (values converted, choices and
    callbacks checked) as a shell would hand them; the command's words."""
    import typer
    import typer.main

    try:  # typer >= 0.20 carries its own click (as cli/main.py)
        from typer import TyperException as UsageError
    except ImportError:
        from click import ClickException as UsageError

    from tilestore.cli.main import app
    from tilestore.errors import TilestoreError

    command, words = typer.main.get_command(app), ["tilestore"]
    while hasattr(command, "commands") and args and args[0] in command.commands:
        words.append(args[0])
        command, args = command.commands[args[0]], args[1:]
    assert not hasattr(command, "commands"), f"no subcommand {args[:1]} of {words}"
    try:
        context = command.make_context(" ".join(words), list(args))
    except typer.Exit:
        return " ".join(words)  # --help
    except UsageError as error:
        raise AssertionError(f"{' '.join(words)}: {error.format_message()}") from error
    # the declared flags' text parsed as the command's wrapper parses it before its body
    declared = getattr(command.callback, "flag_declarations", {})
    for name, given in context.params.items():
        if name in declared and given is not None:
            try:
                (declared[name].check if isinstance(given, bool) else declared[name].parse)(given)
            except TilestoreError as error:
                raise AssertionError(f"{' '.join(words)}: {error}") from error
    return " ".join(words)


def check_bench(words: list[str]) -> str:
    script = next(w for w in words if w.startswith("bench/") and w.endswith(".py"))
    path = REPO / script
    assert path.is_file(), f"{script}: no such benchmark"
    source = path.read_text()
    for flag in [w for w in words if w.startswith("--")]:
        assert f'"{flag}"' in source, f"{script}: no flag {flag}"
    return script


def check_bash(body: str) -> list[str]:
    checked = []
    for line in _lines(body):
        words = _words(line)
        if (args := _tilestore(words)) is not None:
            try:
                checked.append(parse_cli(args))
            except AssertionError as error:
                raise AssertionError(f"{line.strip()}\n  {error}") from error
        elif any(w.startswith("bench/") and w.endswith(".py") for w in words):
            checked.append(check_bench(words))
    return checked


# --- Python blocks ---------------------------------------------------------------------------


def _imports(tree: ast.Module) -> dict[str, object]:
    """{name bound by an import: the object}; an import that fails raises."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                module = importlib.import_module(alias.name)
                if alias.asname:
                    bound[alias.asname] = module
                else:  # `import a.b` binds `a`
                    top = alias.name.split(".")[0]
                    bound[top] = importlib.import_module(top)
        elif isinstance(node, ast.ImportFrom):
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name), f"{node.module} has no {alias.name}"
                bound[alias.asname or alias.name] = getattr(module, alias.name)
    return bound


def _resolve(node: ast.expr, bound: dict[str, object]):
    """The object an expression names from an imported name (`a.b.c`), else None."""
    if isinstance(node, ast.Name):
        return bound.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _resolve(node.value, bound)
        if base is None or not inspect.ismodule(base):
            return None  # an attribute of a value (a Dataset's .features): not checked
        assert hasattr(base, node.attr), f"{base.__name__} has no {node.attr}"
        return getattr(base, node.attr)
    return None


def check_python(body: str) -> list[str]:
    tree = ast.parse(body)
    bound, checked = _imports(tree), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            _resolve(node, bound)
        if not isinstance(node, ast.Call) or not callable(func := _resolve(node.func, bound)):
            continue
        if any(isinstance(a, ast.Starred) for a in node.args) or any(
            k.arg is None for k in node.keywords
        ):
            continue
        try:
            signature = inspect.signature(func)
        except (TypeError, ValueError):
            continue  # a builtin without one
        name = ast.unparse(node.func)
        try:
            signature.bind(*node.args, **{k.arg: k.value for k in node.keywords})
        except TypeError as error:
            raise AssertionError(f"{ast.unparse(node)}: {error}") from error
        checked.append(name)
    return checked


def shown_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced bash or python block not marked to run, indented ones
    (in a list item) too, their indent taken off."""
    found = re.finditer(
        r"^(?P<indent>[ \t]*)```(?P<lang>bash|python)\n(?P<body>.*?)\n(?P=indent)```$",
        text,
        re.MULTILINE | re.DOTALL,
    )
    return [
        (m["lang"], textwrap.dedent(m["body"])) for m in found if not _marked(text[: m.start()])
    ]


def _marked(before: str) -> bool:
    lines = before.rstrip("\n").splitlines()
    return bool(lines) and lines[-1].strip().startswith("<!-- run")
