"""Start-up of `tilestore embed`: where a fresh process's seconds go, with bytecode compiled
(as a user's install has it) and without (the lent GPU machines: PYTHONDONTWRITEBYTECODE and
wheels installed with --no-compile, so every process compiles what it imports).

Arms, each a fresh process of each tree's Python, timed from outside (wall, and CPU seconds
of the process and the children it waited for):
  python          - `python -c pass`;
  the CLI         - `import tilestore.cli.main`;
  CLI and engine  - `import tilestore.cli.main, tilestore.embed.engine` (torch, timm);
  embed --help    - `tilestore embed --help`;
  embed a slide   - `tilestore embed SLIDE --into DIR --model M --device D --report R`, into
                    an empty folder (converted on the way in), with its report's parts.
Conditions (PYTHONPYCACHEPREFIX points every process of an arm at a folder of our own; the
environment's __pycache__ folders are neither read nor written):
  compiled        - a folder that one untimed run of every arm filled;
  not compiled    - a folder holding the standard library's bytecode only, and
                    PYTHONDONTWRITEBYTECODE=1: the packages' modules (site-packages and
                    tilestore) are compiled from source by every process, as there.
Runs are interleaved (run i of every tree and condition, then run i + 1); the tables give
medians. Then one `-X importtime` of "CLI and engine" per tree and condition, summed by
where the seconds go (torch, timm and the torch._dynamo it imports, zarr, typer, ours).
Each tree's last slide run stores its features: their bytes are compared across trees.

    python bench/startup.py --python before=/tmp/base/.venv/bin/python \
        --python after=.venv/bin/python --runs 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SLIDE = Path("/work/shared/data/slides/CMU-1-Small-Region.svs")
ENGINE = "import tilestore.cli.main, tilestore.embed.engine"
ARMS = {
    "python": ["-c", "pass"],
    "the CLI": ["-c", "import tilestore.cli.main"],
    "CLI and engine": ["-c", ENGINE],
    "embed --help": ["-m", "tilestore.cli", "embed", "--help"],
    "embed a slide": ["-m", "tilestore.cli", "embed", "{slide}", "--into", "{into}", "--model",
                      "{model}", "--device", "{device}", "--report", "{report}"],
}  # fmt: skip
BEFORE = "before the engine (process start, imports)"


def timed(python: str, args: list[str], env: dict) -> tuple[float, float]:
    """Run `python ARGS` in a fresh process: its wall and CPU seconds (its own and its
    waited-for children's)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    run = subprocess.run([python, *args], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if run.returncode:
        raise SystemExit(f"{python} {' '.join(args)} failed:\n{run.stdout}\n{run.stderr}")
    cpu = after.ru_utime + after.ru_stime - used.ru_utime - used.ru_stime
    return wall, cpu


def environments(label: str, python: str, work: Path) -> dict[str, dict]:
    """The two conditions' environments for one tree: its compiled folder (filled later,
    by the untimed runs) and the shared folder of the standard library's bytecode."""
    stdlib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['stdlib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    only_stdlib = work / "pyc-stdlib"
    base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    # its site-packages left out: those are the packages; the return code not checked: the
    # standard library's own test data holds sources that do not compile, on purpose
    subprocess.run(
        [python, "-m", "compileall", "-q", "-j", "0", "-x", "site-packages", stdlib],
        env={**base, "PYTHONPYCACHEPREFIX": str(only_stdlib)}, capture_output=True,
    )  # fmt: skip
    return {
        "compiled": {**base, "PYTHONPYCACHEPREFIX": str(work / f"pyc-{label}")},
        "not compiled": {
            **base, "PYTHONPYCACHEPREFIX": str(only_stdlib), "PYTHONDONTWRITEBYTECODE": "1"
        },
    }  # fmt: skip


def arm_args(arm: str, into: Path, report: Path, args: argparse.Namespace) -> list[str]:
    fill = {"slide": args.slide, "into": into, "report": report, "model": args.model}
    return [a.format(**fill, device=args.device) for a in ARMS[arm]]


def run_once(label, python, cond, env, arm, work, args) -> dict:
    """One timed run of one arm; a slide run's report parts with it."""
    into, report = work / f"into-{label}", work / f"report-{label}.json"
    shutil.rmtree(into, ignore_errors=True)
    report.unlink(missing_ok=True)
    wall, cpu = timed(python, arm_args(arm, into, report, args), env)
    row = {"tree": label, "condition": cond, "arm": arm, "wall_s": wall, "cpu_s": cpu}
    if arm == "embed a slide":
        r = json.loads(report.read_text())
        row |= {
            "before_engine_s": r["setup_parts"].get(BEFORE),
            "setup_s": r["setup_s"],
            "first_batch_s": r.get("first_batch_s"),
            "engine_wall_s": r["wall_s"],
            "converted_s": r["converted"][0].get("seconds") if r.get("converted") else None,
        }
    return row


def features_digest(work: Path, label: str) -> str:
    """SHA-256 of the stored features' bytes of the tree's last slide run."""
    import zarr

    (features,) = (work / f"into-{label}").glob("*.ome.zarr/embeddings/*/features")
    features = zarr.open_array(features, mode="r")[...]
    return f"{features.shape} {features.dtype} " + hashlib.sha256(features.tobytes()).hexdigest()


def importtime(python: str, env: dict) -> dict:
    """One `-X importtime` of the CLI and the engine: cumulative seconds of where it goes."""
    run = subprocess.run(
        [python, "-X", "importtime", "-c", ENGINE], env=env, capture_output=True, text=True
    )
    rows = []  # (self s, cumulative s, depth, name), children before their importer
    for line in run.stderr.splitlines():
        if line.startswith("import time:") and "[us]" not in line:
            own, total, name = line.split(":", 1)[1].split("|")
            depth = (len(name) - len(name.lstrip()) - 1) // 2
            rows.append((int(own) / 1e6, int(total) / 1e6, depth, name.strip()))

    def cumulative(name: str) -> float:
        return next((r[1] for r in rows if r[3] == name), 0.0)

    def entries(prefix: str) -> float:
        """Cumulative seconds of the rows named prefix* whose importer is not one."""
        found = 0.0
        for i, (_, total, depth, name) in enumerate(rows):
            if name == prefix or name.startswith(prefix + "."):
                importer = next((r[3] for r in rows[i + 1 :] if r[2] < depth), "")
                if not (importer == prefix or importer.startswith(prefix + ".")):
                    found += total
        return found

    got = {
        "every import (self times)": sum(r[0] for r in rows),
        "tilestore.cli.main": cumulative("tilestore.cli.main"),
        "  of it zarr": entries("zarr"),
        "  of it typer": entries("typer"),
        "torch": cumulative("torch"),
        "timm": cumulative("timm"),
        "  of it torch._dynamo": entries("torch._dynamo"),
        "our own modules (self times)": sum(r[0] for r in rows if r[3].startswith("tilestore")),
    }
    return {k: round(v, 3) for k, v in got.items()}


def tables(rows: list[dict], labels: list[str]) -> list[str]:
    """Medians per arm: each tree's compiled and not compiled, and the difference."""
    med = {}
    for key in ("wall_s", "cpu_s", "before_engine_s", "setup_s", "first_batch_s"):
        for r in rows:
            if r.get(key) is not None:
                med.setdefault((r["tree"], r["condition"], r["arm"], key), []).append(r[key])
    med = {k: statistics.median(v) for k, v in med.items()}
    lines = []
    for key, what in (("wall_s", "wall s"), ("cpu_s", "CPU s")):
        head = [f"{t}: compiled | {t}: not compiled | {t}: compiling" for t in labels]
        lines += [f"| arm ({what}, median) | " + " | ".join(head) + " |",
                  "|---" * (1 + 3 * len(labels)) + "|"]  # fmt: skip
        for arm in ARMS:
            cells = []
            for t in labels:
                c, n = med.get((t, "compiled", arm, key)), med.get((t, "not compiled", arm, key))
                cells += [f"{c:.2f}", f"{n:.2f}", f"{n - c:.2f}"]
            lines.append(f"| {arm} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["| embed a slide: report (median) | " + " | ".join(
        f"{t}, {c}" for t in labels for c in ("compiled", "not compiled")) + " |",
        "|---" * (1 + 2 * len(labels)) + "|"]  # fmt: skip
    for key, what in (
        ("before_engine_s", "before the engine s"),
        ("setup_s", "set-up s"),
        ("first_batch_s", "first batch into the loop s"),
    ):
        cells = [
            f"{med[(t, c, 'embed a slide', key)]:.2f}"
            for t in labels
            for c in ("compiled", "not compiled")
        ]
        lines.append(f"| {what} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--python",
        action="append",
        metavar="LABEL=PATH",
        help="a tree's interpreter (its environment has that tree's tilestore installed); "
        "repeat to compare trees (default: this=sys.executable)",
    )
    parser.add_argument("--slide", type=Path, default=SLIDE)
    parser.add_argument("--model", default="efficientnet-lite0")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path("/tmp/startup-bench"))
    parser.add_argument("--out", type=Path, default=HERE / "results" / "startup.json")
    args = parser.parse_args()
    trees = dict(p.split("=", 1) for p in args.python or [f"this={sys.executable}"])
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    envs = {label: environments(label, python, args.work) for label, python in trees.items()}
    for label, python in trees.items():  # fill the compiled folders: every arm once
        for arm in ARMS:
            run_once(label, python, "warm-up", envs[label]["compiled"], arm, args.work, args)
    rows = []
    for i in range(args.runs):
        for label, python in trees.items():
            for cond, env in envs[label].items():
                for arm in ARMS:
                    rows.append(run_once(label, python, cond, env, arm, args.work, args))
                    print(json.dumps(rows[-1] | {"run": i}), flush=True)
    digests = {label: features_digest(args.work, label) for label in trees}
    imports = {
        f"{label}, {cond}": importtime(python, env)
        for label, python in trees.items()
        for cond, env in envs[label].items()
    }
    lines = tables(rows, list(trees))
    lines += ["", "| -X importtime of `" + ENGINE + "` (cumulative s) | " + " | ".join(imports)
              + " |", "|---" * (1 + len(imports)) + "|"]  # fmt: skip
    for key in next(iter(imports.values())):
        lines.append(f"| {key} | " + " | ".join(f"{v[key]:.2f}" for v in imports.values()) + " |")
    lines += ["", "features (shape, dtype, SHA-256 of the bytes) of each tree's last slide run:"]
    lines += [f"  {label}: {d}" for label, d in digests.items()]
    lines.append(f"  equal: {len(set(digests.values())) == 1}")
    print("\n".join(lines))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "trees": trees,
                "python": sys.version.split()[0],
                "cpus": os.cpu_count(),
                "stdlib": sysconfig.get_paths()["stdlib"],
                "rows": rows,
                "importtime": imports,
                "features": digests,
                "table": lines,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
