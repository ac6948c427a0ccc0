"""A run's settings: the user's `Options`, resolved once into final `Settings`.

`Options` is what a user asks for (each `tilestore embed` flag maps onto one field, and its
defaults are the one table of defaults). `resolve` turns them, with what it asks of the
`Machine` (CUDA, CPUs, whether nvJPEG starts, the model's best batch), into `Settings`:
frozen, every value final. Everything downstream (the runner, the producer, the row
sources, the report) takes `Settings` and decides none of these again. The machine is told
the decoder count as soon as it is decided, so the decoder processes start before anything
that needs the model (measuring the batch size loads it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Literal, Protocol, get_args

from tilestore.caches import user_cache
from tilestore.errors import DeviceError, OptionError
from tilestore.options import Declared, Opt

if TYPE_CHECKING:  # torch loads when a device is resolved: the CLI reads these defaults cheaply
    import torch

DecodeOption = Literal["auto", "cpu", "gpu", "both"]
PrecisionOption = Literal["auto", "bf16", "fp32"]
FeatureDtype = Literal["float16", "float32"]
ProfileOption = Literal["nvtx", "torch"]
Decode = Literal["cpu", "gpu", "both"]
Precision = Literal["bf16", "fp32"]

# From this many CPUs on, decode="auto" decodes on the CPU (CPUs - 2 worker processes);
# below it the processes and the GPU's JPEG engines side by side ("both"; nvJPEG alone
# on a GPU without engines), unless the model alone is slower than the processes decode
# (`CPU_DECODE_TILES_PER_S`). On an H100, compiled, the copied store's 240 px chunks, the
# job's CPUs limited as taskset does, fraction of the model's ceiling, one slide / a
# cohort of three (bench/RESULTS.md, "Decode paths by CPU count"):
#   model (ceiling)  | CPUs | cpu         | gpu (engines) | both
#   ViT-S (28,114/s) |    4 | 0.23 / 0.22 | 0.44 / 0.45   | 0.50 / 0.45
#                    |    8 | 0.58 / 0.65 | 0.48 / 0.46   | 0.58 / 0.59
#                    |   16 | 0.76 / 0.86 | 0.48 / 0.45   | 0.65 / 0.64
#   ViT-B (10,775/s) |    4 | 0.61 / 0.67 | 0.72 / 0.73   | 0.75 / 0.76
#                    |    8 | 0.92 / 0.96 | 0.72 / 0.73   | 0.81 / 0.83
#                    |   16 | 0.88 / 0.96 | 0.73 / 0.74   | 0.75 / 0.88
#   ViT-L (3,668/s)  |    4 | 0.89 / 0.97 | 0.79 / 0.86   | 0.80 / 0.86
# The engines decode these chunks at 29,000/s alone but a few thousand beside a model:
# nvJPEG's per-image work waits for the model's (docs/how-to/few-cpus-per-gpu.md).
AUTO_CPU_DECODE_CPUS = 8
# Tiles/s one decoder process feeds (240 px chunks, 224 px tiles), less 10%: on an H100 2
# processes fed 6,200-7,200 tiles/s, 6 fed 16,200-18,400 (bench/RESULTS.md). A model alone
# at most this fast per process (ViT-L, 3,668 tiles/s on 4 CPUs) is fed best by the CPU.
CPU_DECODE_TILES_PER_S = 2_700
CPU_BATCH = 32  # tiles per batch on the CPU: larger batches gain nothing there
RESERVED_CPUS = 2  # left to the threads that read, cut and feed the GPU; the rest decode
SLICE_TILES = 20_000  # on Dask, at most this many tiles per task: big slides spread over GPUs
# on Dask, slices of fewer tiles (small slides) go several to a task, up to this many tiles
# in all (fewer where that leaves workers without one): a run's set-up is paid once for them
TASK_TILES = 4_096
TASK_SLICES = 256  # and at most this many slices a task
BATCHES = (32, 64, 128, 256, 512, 1024)  # the batch sizes `--batch-size auto` measures
REPEATS = 5  # timed batches per size, after one untimed
Device = Annotated[
    str,
    Opt(
        "auto (CUDA if there is one), cpu, cuda or cuda:N.",
        pattern=r"auto|cpu|cuda(:\d+)?",
        shape="'auto', 'cpu', 'cuda' or 'cuda:N'",
        metavar="auto|cpu|cuda|cuda:N",
    ),
]
MAX_TILES = 10**9  # tiles of one slide: a 100,000 px slide at 0.25 um/px and 224 px has 0.8M

# The options of a cohort run and of `models profile`, besides a run's `Options`.
SliceTiles = Annotated[
    int,
    Opt(
        "On Dask: at most this many tiles per task (big slides are split).",
        low=1,
        high=MAX_TILES,
    ),
]
Share = Annotated[
    str | None,
    Opt(
        "Embed only the K-th (0-based) of N size-balanced shares of the stores (a SLURM "
        "array: K=$SLURM_ARRAY_TASK_ID).",
        pattern=r"\d+/[1-9]\d*",
        shape="K/N, two whole numbers, e.g. 0/8",
        metavar="K/N",
    ),
]
BatchSizes = Annotated[
    tuple[int, ...],
    Opt("Batch sizes to measure, comma-separated.", low=1, high=65_536, metavar="N,N,..."),
]
Repeats = Annotated[int, Opt("Timed batches per size.", low=1, high=10_000)]
MAX_BATCH = 65_536  # tiles: no GPU holds a bigger batch of 224 px tiles and a model
MAX_THREADS = 1_024  # readers or decoders: more than any node's cores
MAX_PREFETCH = 256  # batches waiting ahead of the model


@dataclass(frozen=True)
class Options(Declared):
    """How to run an embedding, as the user asks: each `tilestore embed` option is a field,
    declared once here (type, range, default, help: `tilestore.options`), checked when made.

    decode "auto": the CPU from `AUTO_CPU_DECODE_CPUS` CPUs on; below, the processes and
    nvJPEG on the GPU's JPEG engines side by side ("both"; `tilestore.embed.rows.BothRows`),
    nvJPEG alone where the GPU has no engines; the CPU wherever nvJPEG does not start.
    channels: of a store that is not one RGB picture (multiplex fluorescence), each over its
    display window (`tilestore.reading.slide.Slide.as_rgb`). profile "torch" records
    `profile_batches` batches after two skipped and two warming up. compile_cache: a shared
    folder serves a SLURM array (`tilestore.embed.compilecache`). quality: off by default: on an
    H100 the measures cost a ViT-S 3.6% of its tiles/s, a ViT-B 0.3% (bench/RESULTS.md).
    """

    batch_size: Annotated[
        int | None,
        Opt(
            "Tiles per batch.",
            low=1,
            high=MAX_BATCH,
            none=f"auto: the largest that fits and still speeds the model up ({CPU_BATCH} on "
            "the CPU)",
            none_word="auto",
            metavar="N|auto",
        ),
    ] = None
    device: Device = "auto"
    decode: Annotated[
        DecodeOption,
        Opt(
            "JPEG decoding: cpu (worker processes), gpu (nvJPEG), both (the processes and the "
            f"GPU's JPEG engines side by side), or auto: cpu from {AUTO_CPU_DECODE_CPUS} CPUs "
            "on; below, both where the GPU has JPEG engines (A100, H100), else gpu. The "
            "report says which ran and why."
        ),
    ] = "auto"
    precision: Annotated[
        PrecisionOption, Opt("auto (bf16 on CUDA, fp32 on the CPU), bf16 or fp32.")
    ] = "auto"
    dtype: Annotated[FeatureDtype, Opt("Stored features: float16 or float32.")] = "float16"
    compile: Annotated[
        bool,
        Opt(
            "torch.compile the model and its transform (slow start, faster run; on a GPU "
            "batches are replayed as CUDA graphs either way, where the model allows)."
        ),
    ] = False
    readers: Annotated[
        int,
        Opt(
            "Threads reading chunk rows ahead (GPU decode) or cutting tiles (CPU).",
            low=1,
            high=MAX_THREADS,
        ),
    ] = 4
    decoders: Annotated[
        int | None,
        Opt(
            "CPU JPEG decoders: worker processes on CUDA, threads without.",
            low=1,
            high=MAX_THREADS,
            none=f"auto: the job's CPUs - {RESERVED_CPUS}",
            none_word="auto",
            metavar="N|auto",
        ),
    ] = None
    prefetch: Annotated[
        int, Opt("Batches of tiles ready ahead of the model.", low=1, high=MAX_PREFETCH)
    ] = 4
    overwrite: Annotated[bool, Opt("Recompute embeddings this model already made.")] = False
    break_lock: Annotated[
        bool,
        Opt(
            "Take over the lock of a run writing a store whatever its heartbeat: your word "
            "that its job is dead (a lock silent for 5 min is taken over without it)."
        ),
    ] = False
    hf_token: Annotated[
        str | None, Opt("Hugging Face token.", none="HF_TOKEN or the stored login")
    ] = None
    channels: Annotated[
        tuple[str, ...] | None,
        Opt(
            "Multiplex stores: three channels (names or indices, e.g. DAPI,CD8,PanCK) given "
            "to the model as R, G, B, each over its display window.",
            metavar="A,B,C",
        ),
    ] = None
    profile: Annotated[
        ProfileOption | None,
        Opt(
            "nvtx: NVTX ranges on every stage, for `nsys profile`; torch: a torch.profiler "
            "trace of --profile-batches batches to --profile-out."
        ),
    ] = None
    profile_out: Annotated[
        str | os.PathLike,
        Opt("--profile torch: the trace file (Chrome/Perfetto JSON).", metavar="FILE"),
    ] = "tilestore-trace.json"
    profile_batches: Annotated[
        int, Opt("--profile torch: batches recorded.", low=1, high=100_000)
    ] = 20
    max_tiles: Annotated[
        int | None,
        Opt(
            "A trial: embed only each slide's first N plan tiles (whole batches); a later "
            "run without it finishes the slides.",
            low=1,
            high=MAX_TILES,
            none="every tile",
        ),
    ] = None
    compile_cache: Annotated[
        Literal["auto", "off"] | str | os.PathLike | None,
        Opt(
            "--compile: where compiled graphs are kept between runs (auto: the user cache; "
            "a shared folder serves a SLURM array; off: none).",
            shape="a folder",
            metavar="DIR|auto|off",
        ),
    ] = "auto"
    shard_tiles: Annotated[
        int | None,
        Opt(
            "Tiles per file of the features a new embeddings group stores (whole batches); a "
            "group being resumed keeps its own.",
            low=1,
            high=2**24,
            none="the layout's, about 4,096",
        ),
    ] = None
    tokens: Annotated[
        int | Literal["model"] | None,
        Opt(
            "Also store each tile's patch tokens (embeddings/<model>/<plan>/tokens), "
            "average-pooled to an N x N grid; 'model': the model's own grid (ViT/16 at 224 "
            "px: 14 x 14).",
            low=1,
            high=256,
            none="features only",
            metavar="N|model",
        ),
    ] = None
    quality: Annotated[
        bool,
        Opt(
            "Also measure each tile's quality in the same pass (blur, tissue, light, ink) "
            "and store it beside the features (ds.blur ...): a plan's --max-blur and "
            "ds.tiles.keep() can then leave blurred tiles out."
        ),
    ] = False
    any_scale: Annotated[
        bool,
        Opt(
            "Embed a plan whose um/px or tile differs from the model's native input beyond "
            "the tolerance, or whose um/px is unknown (refused without it)."
        ),
    ] = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.channels is not None and len(self.channels) != 3:
            raise OptionError(
                f"channels={','.join(self.channels)!r}: an RGB model takes three channels, "
                "as its R, G and B"
            )


@dataclass(frozen=True)
class Settings:
    """The run's final settings: the options as asked, and what `resolve` decided from them
    and the machine. An option `resolve` does not decide is read through from `options`
    (``settings.readers`` is ``settings.options.readers``): nothing is copied field by field,
    so an option added to `Options` reaches every reader of the settings at once."""

    device: torch.device  # with its index on CUDA
    precision: Precision
    decode: Decode  # "gpu" or "both" only where an nvJPEG decoder started
    gpu_decoder: str | None  # that decoder's name (decode gpu or both), for the record
    decoders: int
    batch_size: int
    options: Options = Options()
    compile_cache: str | None = None  # a folder; None: no cache
    decode_why: str = ""  # why decode is what it is (the report says it)

    def __getattr__(self, name: str):
        """The options `resolve` passed on as asked: readers, prefetch, dtype, compile..."""
        if name.startswith("__") or name == "options":  # copy and pickle ask before init
            raise AttributeError(name)
        return getattr(self.options, name)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


class Machine(Protocol):
    """What `resolve` asks of the machine, and tells it: each question is asked at most
    once, and only where the answer decides something (a run on the CPU never starts
    nvJPEG)."""

    def cuda_device(self) -> int | None:
        """The current CUDA device's index; None where CUDA is not available."""

    def cpus(self) -> int:
        """CPUs this job may use (its affinity, or its share of a machine)."""

    def start_decoders(self, count: int, nvtx_marks: bool) -> None:
        """Start `count` JPEG decoder processes for a run on CUDA (they import while the
        model loads); with `nvtx_marks` they mark their work as NVTX ranges."""

    def gpu_jpeg(self, device: torch.device, required: bool) -> str | None:
        """Start a GPU JPEG decoder on `device`; its name, or None where none starts
        (raising instead if `required`)."""

    def jpeg_engines(self) -> int:
        """The JPEG engines the started GPU decoder uses (0: it decodes with CUDA kernels)."""

    def best_batch(self, device: torch.device, precision: Precision) -> int:
        """The model's best batch size on `device`, measured."""

    def model_rate(self, device: torch.device, precision: Precision) -> float | None:
        """The model's best tiles/s alone on `device`, where its batch size was searched
        (now or in an earlier run); None where it never was."""


def resolve(options: Options, machine: Machine) -> Settings:
    """Return the run's final settings: every "auto" and None of `options` decided, for the
    machine `machine` answers for (the options' values were checked when they were made)."""
    device = _device(options.device, machine)
    precision = _precision(options.precision, device)
    decoders = options.decoders or max(2, machine.cpus() - RESERVED_CPUS)
    if device.type == "cuda":
        machine.start_decoders(decoders, options.profile == "nvtx")
    batch = _batch(options.batch_size, device, precision, machine)
    decode, gpu_decoder, why = _decode(options.decode, device, precision, decoders, machine)
    return Settings(
        device=device,
        precision=precision,
        decode=decode,
        gpu_decoder=gpu_decoder,
        decoders=decoders,
        batch_size=batch,
        options=options,
        compile_cache=_compile_cache(options.compile_cache),
        decode_why=why,
    )


def resolve_device(device: str = "auto", precision: str = "auto") -> tuple[torch.device, Precision]:
    """The device and precision a model runs in outside a run (`tilestore models profile`),
    decided by the same rules as `resolve`: "auto" is CUDA where there is one, else the CPU;
    bf16 on CUDA, fp32 on the CPU."""
    dev = _device(device, _ThisMachine())
    return dev, _precision(precision, dev)


class _ThisMachine:
    """What `_device` asks of the machine, answered by torch here and now."""

    @staticmethod
    def cuda_device() -> int | None:
        import torch

        return torch.cuda.current_device() if torch.cuda.is_available() else None


MAX_SHARES = 4_000_001  # SLURM's largest job array (MaxArraySize's own limit)


def parse_shard(text: str) -> tuple[int, int]:
    """'3/10' -> (3, 10): the K-th of N shares of a cohort (K in 0..N-1)."""
    try:
        k, n = (int(p) for p in text.split("/"))
    except ValueError:
        raise OptionError(f"shard={text!r}: expected 'K/N', e.g. '0/8'") from None
    check_share(k, n)
    return k, n


def check_share(k: int, n: int) -> None:
    """OptionError unless K is in 0..N-1 and N at most `MAX_SHARES`."""
    if not 1 <= n <= MAX_SHARES:
        raise OptionError(
            f"shard='{k}/{n}': N must be 1 to {MAX_SHARES:,} (SLURM's largest job array)"
        )
    if not 0 <= k < n:
        raise OptionError(f"shard='{k}/{n}': K must be in 0..N-1 (e.g. $SLURM_ARRAY_TASK_ID)")


def _compile_cache(option: str | None) -> str | None:
    """ "auto": the user's cache folder; "off" or None: no cache; else the folder given."""
    if option in (None, "off"):
        return None
    if option == "auto":
        return str(user_cache() / "compile")
    return str(option)


def _device(name: str, machine: Machine) -> torch.device:
    """The device, with its index on CUDA (nvJPEG keeps one decoder per device as named)."""
    import torch

    cuda = machine.cuda_device()
    if name == "auto":
        name = "cuda" if cuda is not None else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise OptionError(f"device={name!r}: choose 'auto', 'cpu', 'cuda' or 'cuda:N'") from None
    if device.type not in ("cpu", "cuda"):
        raise OptionError(f"device={name!r}: choose 'auto', 'cpu', 'cuda' or 'cuda:N'")
    if device.type == "cuda" and cuda is None:
        raise DeviceError(f"device={name!r}: no CUDA device is visible (CUDA_VISIBLE_DEVICES?)")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", cuda)
    return device


def _precision(option: str, device: torch.device) -> Precision:
    option = _choice("precision", option, PrecisionOption)
    if option == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    return option


def _decode(
    option: str, device: torch.device, precision: Precision, decoders: int, machine: Machine
) -> tuple[Decode, str | None, str]:
    """cpu, gpu or both; the GPU decoder's name; and why. "auto" is the CPU without CUDA,
    from `AUTO_CPU_DECODE_CPUS` CPUs on, or where the model alone (its measured ceiling)
    is slower than the decoder processes decode; else the decoder processes and the GPU's
    JPEG engines side by side where it has engines, nvJPEG alone where it has none, and the
    CPU where no GPU decoder starts."""
    option = _choice("decode", option, DecodeOption)
    cuda = device.type == "cuda"
    if option in ("gpu", "both") and not cuda:
        raise DeviceError(f"decode={option!r} needs a CUDA device")
    if option == "cpu":
        return "cpu", None, "asked for"
    if option == "auto" and not cuda:
        return "cpu", None, "no CUDA device"
    cpus = machine.cpus()
    if option == "auto" and cpus >= AUTO_CPU_DECODE_CPUS:
        return "cpu", None, f"{cpus} CPUs: {cpus - RESERVED_CPUS} decoder processes keep up"
    rate = machine.model_rate(device, precision) if option == "auto" else None
    keep_up = decoders * CPU_DECODE_TILES_PER_S
    if rate is not None and rate <= keep_up:
        why = (
            f"the model runs {rate:,.0f} tiles/s alone: {decoders} decoder processes keep up, "
            f"about {keep_up:,} tiles/s"
        )
        return "cpu", None, why
    name = machine.gpu_jpeg(device, required=option != "auto")
    if name is None:
        return "cpu", None, "no GPU JPEG decoder starts on this GPU"
    if option != "auto":
        return option, name, "asked for"
    engines = machine.jpeg_engines()
    if engines:
        why = f"{cpus} CPUs and {engines} JPEG engines: the processes and the engines together"
        return "both", name, why
    return "gpu", name, f"{cpus} CPUs, no JPEG engines: nvJPEG on the GPU"


def _batch(option: int | None, device: torch.device, precision: Precision, machine) -> int:
    if option is not None:
        return option
    if device.type != "cuda":
        return CPU_BATCH
    return machine.best_batch(device, precision)


def _choice(name: str, value: str, allowed) -> str:
    choices = get_args(allowed)
    if value not in choices:
        raise OptionError(
            f"{name}={value!r}: choose {', '.join(map(repr, choices[:-1]))} or {choices[-1]!r}"
        )
    return value
