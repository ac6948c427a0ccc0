"""Library messages name parameters; the command prints them as its flags."""

from __future__ import annotations

from tilestore.cli.console import as_flags, flags_of
from tilestore.cli.embed import embed
from tilestore.cli.main import _flags, convert, plan


def test_flags_are_the_ones_typer_makes():
    flags = flags_of(convert, embed)
    assert flags["overwrite"] == ("--overwrite", "--no-overwrite")
    assert flags["compile"] == ("--compile", None)  # declared as --compile alone
    assert flags["batch_size"] == ("--batch-size", None)
    assert flags["output"] == ("--output", None)  # declared "-o", "--output"
    assert "stores" not in flags  # an argument, not an option


def test_settings_become_flags():
    flags = flags_of(convert, plan, embed)
    cases = [
        ("pass overwrite=True to replace it", "pass --overwrite to replace it"),
        ("copy=False re-encodes", "--no-copy re-encodes"),
        ("decode='nvdec': choose 'auto' or 'cpu'", "--decode nvdec: choose 'auto' or 'cpu'"),
        (
            "convert again with mpp=<um/px>, or plan in level-0 pixels (mpp=0)",
            "convert again with --mpp <um/px>, or plan in level-0 pixels (--mpp 0)",
        ),
        ("kept with min_tissue=0.5, min_roi=0.3", "kept with --min-tissue 0.5, --min-roi 0.3"),
        ("(readers=, decoders=)", "(--readers, --decoders)"),
        ("pid=123 on host", "pid=123 on host"),  # not a flag: left alone
    ]
    for message, shown in cases:
        assert as_flags(message, flags) == shown


def test_every_command_is_covered():
    flags = _flags()
    assert {"overwrite", "mpp", "min_tissue", "decode", "hf_token", "clusters"} <= set(flags)
