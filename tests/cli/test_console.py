"""Library messages name parameters; the command prints them as its flags."""

from __future__ import annotations

from tilestore.cli.console import as_flags, flags_of
from tilestore.cli.embed import embed
from tilestore.cli.main import _flags, convert, plan


def test_flags_are_the_ones_typer_makes():
    flags = flags_of(convert, embed, plan)
    assert flags["overwrite"] == ("--overwrite", "--no-overwrite")
    assert flags["compile"] == ("--compile", "--no-compile")  # generated: a switch
    assert flags["max_min"] == flags["contrast_min"] == ("--contrast-min", None)  # nested
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
            "convert again with mpp=<um/px>, or plan in level-0 pixels (mpp='level0')",
            "convert again with --mpp <um/px>, or plan in level-0 pixels (--mpp level0)",
        ),
        ("kept with min_tissue=0.5, min_roi=0.3", "kept with --min-tissue 0.5, --min-roi 0.3"),
        ("(readers=, decoders=)", "(--readers, --decoders)"),
        ("pid=123 on host", "pid=123 on host"),  # not a flag: left alone
        # a list as the library names it (multiplex refusals): the flag and the whole list
        ("as its R, G, B (channels=A,B,C)", "as its R, G, B (--channels A,B,C)"),
    ]
    for message, shown in cases:
        assert as_flags(message, flags) == shown


def test_every_command_is_covered():
    flags = _flags()
    assert {"overwrite", "mpp", "min_tissue", "decode", "hf_token", "clusters"} <= set(flags)


def test_progress_in_a_log_is_a_line_every_interval_and_at_the_end(capsys):
    """Where stderr is not a terminal (a SLURM log), progress is lines: one each `every`
    seconds with the rate and time left, and one at the end."""
    from tilestore.progress import LogLines

    now = [0.0]
    lines = LogLines("embedding with uni", 30.0, clock=lambda: now[0])
    for _ in range(10):  # 10 batches of 100 tiles, 10 s apart
        now[0] += 10.0
        lines.update(0, advance=100, total=1000)
    lines.finish()
    said = capsys.readouterr().err.strip().splitlines()
    assert said == [
        "embedding with uni: 300 of 1,000 done in 30 s (10.0/s), about 70 s left",
        "embedding with uni: 600 of 1,000 done in 60 s (10.0/s), about 40 s left",
        "embedding with uni: 900 of 1,000 done in 90 s (10.0/s), about 10 s left",
        "embedding with uni: 1,000 of 1,000 done in 100 s (10.0/s)",
    ]


def test_a_total_still_growing_is_said_so_and_no_time_left_is_guessed(capsys):
    """While stores are not planned yet the total is a floor ("N+"): a time left from it
    would be too short ("474 of 495 ... about 3 s left" with 315 tiles unplanned)."""
    from tilestore.cli.console import _Bar
    from tilestore.progress import AtLeast, LogLines

    now, said = [30.0], []
    lines = LogLines("embedding with uni", 30.0, clock=lambda: now[0], write=said.append)
    lines.started = lines.last = 0.0
    lines(474, AtLeast(495, 2))
    now[0] = 60.0
    lines(21, 810)  # every store planned: exact
    assert said == [
        "embedding with uni: 474 of 495+ done in 30 s (15.8/s), 2 store(s) not planned yet",
        "embedding with uni: 495 of 810 done in 60 s (8.2/s), about 38 s left",
    ]
    bar = _Bar()
    task = bar.add_task("embedding", total=None)
    bar.update(task, advance=474, total=AtLeast(495, 2))
    assert bar.tasks[0].total is None and bar.tasks[0].completed == 474  # open: "474/?"
    bar.update(task, advance=21, total=810)
    assert bar.tasks[0].total == 810


def test_a_cohorts_progress_lines_say_the_workers_alive():
    """`embed_cohort` without a progress callback logs through LogLines with the workers'
    state on each line (`Membership.status`); the lines go where `write` says."""
    from tilestore.progress import LogLines

    now, said, alive = [0.0], [], ["2 worker(s) alive"]
    lines = LogLines("uni on Dask", 30.0, clock=lambda: now[0], status=lambda: alive[0],
                     write=said.append)  # fmt: skip
    now[0] = 30.0
    lines(300, 1000)  # as the cohort's progress(tiles, total) callback
    alive[0] = "1 worker(s) alive, 1 lost"
    now[0] = 60.0
    lines(300, 1000)
    assert said == [
        "uni on Dask: 300 of 1,000 done in 30 s (10.0/s), about 70 s left; 2 worker(s) alive",
        "uni on Dask: 600 of 1,000 done in 60 s (10.0/s), about 40 s left; "
        "1 worker(s) alive, 1 lost",
    ]


def test_what_a_run_says_as_it_works_goes_to_the_log_at_once_or_above_the_bar(capsys):
    """A compile is minutes without a batch: its lines reach a SLURM log as they are said
    (not at exit), and on a terminal print above the live bar instead of through it."""
    from rich.console import Console
    from rich.progress import Progress

    from tilestore.cli.console import line_printer
    from tilestore.progress import LogLines

    line_printer(LogLines("embedding with uni", 30.0))("compiling uni for batch 512 ...")
    assert capsys.readouterr().err == "compiling uni for batch 512 ...\n"
    terminal = Console(record=True, force_terminal=True, width=200)
    with Progress(console=terminal) as bar:
        line_printer(bar)("waiting for node12:4711 compiling /shared/uni-1.bin [for 40 s]")
    assert (
        "waiting for node12:4711 compiling /shared/uni-1.bin [for 40 s]" in terminal.export_text()
    )
