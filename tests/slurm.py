"""A one-node SLURM for the tests: munge, slurmctld and slurmd of Debian's slurm-wlm, started
as root in a folder of their own (config, state, spool, logs, sockets), on free ports, and
stopped with everything they ran.

`Slurm.start(folder)` returns a running cluster or raises `Unavailable` saying why (no
slurm-wlm, not root): the fixture turns that into a skip with the reason. Clients reach it
through `SLURM_CONF` (`Slurm.env`), so nothing under /etc is touched and several may run at
once (pytest-xdist workers each start their own).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LITE = "efficientnet-lite0"
# the flags that make a CPU run of the recipes' commands: small batches (many of them, so a
# signal or a cancel lands mid-slide), float32 features
CPU_FLAGS = "--device cpu --batch-size 8 --precision fp32 --dtype float32 --shard-tiles 16"
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "sacct")


class Unavailable(Exception):
    """This machine cannot run a SLURM for the tests (the reason is the message)."""


@dataclass
class Slurm:
    folder: Path
    node: str
    cpus: int
    memory_mb: int
    env: dict[str, str]
    pids: list[int]

    # -- start and stop ---------------------------------------------------------------------

    @classmethod
    def start(cls, folder: Path, cpus: int | None = None) -> Slurm:
        missing = [d for d in DAEMONS + CLIENTS if not _which(d)]
        if missing:
            raise Unavailable(f"slurm-wlm/munge not installed (no {', '.join(missing)})")
        if os.geteuid() != 0:
            raise Unavailable("slurmd must run as root to start jobs; these tests run as a user")
        folder.mkdir(parents=True, exist_ok=True)
        for sub in ("state", "spool", "munge", "jobs"):
            (folder / sub).mkdir(exist_ok=True)
        node = socket.gethostname().split(".")[0]
        cpus = cpus or os.cpu_count() or 1
        memory_mb = _memory_mb()
        key = folder / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        munge_socket = folder / "munge" / "socket"
        ctld_port, d_port = _free_port(), _free_port()
        conf = folder / "slurm.conf"
        conf.write_text(_config(folder, node, cpus, memory_mb, munge_socket, ctld_port, d_port))
        env = {**os.environ, "SLURM_CONF": str(conf)}
        slurm = cls(folder, node, cpus, memory_mb, env, [])
        try:
            slurm._daemon(
                [
                    "munged",
                    "--force",
                    f"--socket={munge_socket}",
                    f"--key-file={key}",
                    f"--pid-file={folder / 'munge' / 'pid'}",
                    f"--log-file={folder / 'munge.log'}",
                    f"--seed-file={folder / 'munge' / 'seed'}",
                ],
                folder / "munge" / "pid",
            )
            slurm._daemon(["slurmctld", "-f", str(conf)], folder / "slurmctld.pid")
            slurm._daemon(["slurmd", "-f", str(conf)], folder / "slurmd.pid")
            slurm._wait_idle()
        except BaseException:
            slurm.stop()
            raise
        return slurm

    def stop(self) -> None:
        """Cancel every job, then stop the daemons (their jobs' processes go with slurmd)."""
        if self.pids:
            subprocess.run(["scancel", "--full", "--user", "root"], env=self.env,
                           capture_output=True, timeout=30, check=False)  # fmt: skip
            time.sleep(1)
        for pid in reversed(self.pids):
            try:
                os.kill(pid, 15)
            except ProcessLookupError:
                continue
            for _ in range(100):
                if not _alive(pid):
                    break
                time.sleep(0.1)
            else:
                os.kill(pid, 9)
        self.pids = []

    def _daemon(self, argv: list[str], pidfile: Path) -> None:
        run = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60)
        for _ in range(100):
            if pidfile.exists() and pidfile.read_text().strip():
                break
            time.sleep(0.1)
        else:
            logs = "; ".join(
                p.read_text()[-400:] for p in self.folder.glob("*.log") if p.stat().st_size
            )
            raise RuntimeError(f"{argv[0]} did not start (rc {run.returncode}: "
                               f"{run.stderr.strip()} {logs})")  # fmt: skip
        self.pids.append(int(pidfile.read_text().split()[0]))

    def _wait_idle(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.run("sinfo", "-h", "-o", "%T", check=False).stdout.strip()
            if state.startswith("idle"):
                return
            if state.startswith(("down", "drain")):
                self.run("scontrol", "update", f"nodename={self.node}", "state=resume",
                         check=False)  # fmt: skip
            time.sleep(0.5)
        raise RuntimeError(f"the node did not come up (sinfo says {state!r}): "
                           f"{(self.folder / 'slurmd.log').read_text()[-800:]}")  # fmt: skip

    # -- clients ----------------------------------------------------------------------------

    def run(self, *argv: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True,
                              timeout=60, check=check, **kwargs)  # fmt: skip

    def sbatch(self, script: Path, *options: str, cwd: Path | None = None) -> int:
        """Submit a batch script; return its job id."""
        done = self.run("sbatch", "--parsable", *options, str(script), cwd=cwd)
        return int(done.stdout.strip().split(";")[0])

    def states(self, job: int) -> dict[str, str]:
        """Each task of a job (or array) that SLURM still knows: id -> state."""
        shown = self.run("squeue", "-h", "-j", str(job), "-o", "%i %T", check=False).stdout
        return dict(line.split() for line in shown.splitlines() if line.strip())

    def jobs(self, name: str, state: str) -> list[int]:
        """The ids of jobs of this name in this state (e.g. dask-jobqueue's workers)."""
        shown = self.run("squeue", "-h", "-n", name, "-t", state, "-o", "%i", check=False).stdout
        return sorted(int(line) for line in shown.split())

    def job_ids(self, name: str) -> set[int]:
        """Every job of this name SLURM still remembers (MinJobAge: 10 minutes), in any state."""
        shown = self.run("scontrol", "-o", "show", "job", check=False).stdout
        return {
            int(fields["JobId"])
            for line in shown.splitlines()
            for fields in [dict(f.split("=", 1) for f in line.split() if "=" in f)]
            if fields.get("JobName") == name
        }

    def wait(self, job: int, timeout: float) -> None:
        """Until no task of the job is pending, running or being requeued."""
        deadline = time.monotonic() + timeout
        while self.states(job):
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job} still {self.states(job)} after {timeout:.0f} s")
            time.sleep(1)

    def exit_codes(self, job: int) -> dict[str, str]:
        """What scontrol remembers of each finished task: id -> 'STATE exit:signal'."""
        shown = self.run("scontrol", "-o", "show", "job", str(job), check=False).stdout
        result = {}
        for line in shown.splitlines():
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            task = fields.get("ArrayTaskId")
            name = f"{fields['ArrayJobId']}_{task}" if task else fields.get("JobId", "?")
            result[name] = f"{fields.get('JobState')} {fields.get('ExitCode')}"
        return result


# -- the recipes (docs/how-to/cohort-slurm.md), adapted to CPUs -----------------------------------


RECIPES = REPO / "docs" / "how-to" / "cohort-slurm.md"  # the page users copy them from


def recipe_block(marker: str, language: str) -> str:
    """The recipes page's code block of this language that contains `marker`."""
    blocks = re.findall(rf"```{language}\n(.*?)```", RECIPES.read_text(), re.S)
    (block,) = [b for b in blocks if marker in b]
    return block


def adapted(text: str, changes: dict[str, str]) -> str:
    """The recipe's text with the CPU adaptations, each of which must still apply: a recipe
    that drifts from what these tests run fails them."""
    for old, new in changes.items():
        assert old in text, f"the recipe ({RECIPES.name}) no longer says {old!r}"
        text = text.replace(old, new)
    return text


def array_script(tasks: int, extra: str = "", compile_cache: str | None = None) -> str:
    """The recipes' array script for `tasks` tasks on CPUs (extra: more #SBATCH options).
    compile_cache: keep its --compile, with this shared cache (each task an Inductor cache
    of its own, as on its own node); None: drop it (minutes a task on a CPU)."""
    compiled = (
        f" --compile \\\n    --compile-cache {compile_cache}" if compile_cache else " \\\n   "
    )
    script = adapted(
        recipe_block("--array=0-19\n", "bash"),
        {
            "--gres=gpu:1 --cpus-per-task=16": f"--cpus-per-task=1{extra}",
            "--array=0-19": f"--array=0-{tasks - 1}",
            '/20"': f'/{tasks}"',
            "--model uni": f"--model {LITE} {CPU_FLAGS}",
            " --compile \\\n    --compile-cache /shared/tilestore-compile": compiled,
            "$HOME/.cache/tilestore": "$PWD/cache",
        },
    )
    if compile_cache:  # a node's own Inductor cache: only the shared entry is shared
        script = script.replace(
            "\ntilestore embed",
            "\nexport TORCHINDUCTOR_CACHE_DIR=$PWD/inductor-$SLURM_ARRAY_TASK_ID\ntilestore embed",
        )
    return script


def time_limit_script(tasks: int, time: str, signal: str) -> str:
    """The time-limit recipe's array script for `tasks` tasks on CPUs: its --time and
    --signal replaced by these (e.g. "1", "B:USR1@30"), the rest as the recipe says."""
    return adapted(
        recipe_block("--signal=B:USR1@", "bash"),
        {
            "--gres=gpu:1 --cpus-per-task=16": "--cpus-per-task=1",
            "--array=0-19": f"--array=0-{tasks - 1}",
            "--time=04:00:00": f"--time={time}",
            "--signal=B:USR1@120": f"--signal={signal}",
            '/20"': f'/{tasks}"',
            "--model uni": f"--model {LITE} {CPU_FLAGS}",
            " --compile \\\n    --compile-cache /shared/tilestore-compile": " \\\n   ",
            "$HOME/.cache/tilestore": "$PWD/cache",
        },
    )


def _config(folder, node, cpus, memory_mb, munge_socket, ctld_port, d_port) -> str:
    return f"""\
ClusterName=tilestore-tests
SlurmctldHost={node}
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
AuthInfo=socket={munge_socket},cred_expire=10
CredType=cred/munge
StateSaveLocation={folder / "state"}
SlurmdSpoolDir={folder / "spool"}
SlurmctldPidFile={folder / "slurmctld.pid"}
SlurmdPidFile={folder / "slurmd.pid"}
SlurmctldLogFile={folder / "slurmctld.log"}
SlurmdLogFile={folder / "slurmd.log"}
SlurmctldDebug=info
SlurmdDebug=info
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
MinJobAge=600
KillWait=30
DefMemPerCPU={max(100, memory_mb // max(cpus, 1) // 2)}
NodeName={node} CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _memory_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024 // 2  # half: the tests' jobs share the machine
    return 4096


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split()[2] == "Z")
