"""How one slide's tiles are made in a run, decided in one place: `decode_plan`.

The run's decode setting (cpu, gpu or both: `tilestore.embed.settings.resolve`, from the
machine and the model's rate) says what a run may use; a slide's `DecodePlan` says what its
level gets, from that setting, the machine (CUDA, decoder processes, a GPU JPEG decoder that
has not failed) and the store's chunks (JPEG or not, colour, frames a GPU decodes, nvJPEG's
pixels against libjpeg's on a sample): its row source (`path`), where that decodes (the
report's word) and why. The run (`tilestore.embed.produce`), its fallback after a GPU decode
fails (the same function, the GPU decoder left out) and the dry run all ask it, through
`slide_decoding`: the sample checked, the fallback, and the one rule of what is said.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from tilestore.embed.nvjpeg import GpuDecodeFailed, GpuJpeg, gpu_decode_agrees, gpu_decodes

if TYPE_CHECKING:
    from tilestore.embed.settings import Settings
    from tilestore.format.chunks import ChunkReader
    from tilestore.plan.grid import TilePlan

DecodePath = Literal["nvjpeg", "both", "processes", "threads", "cut"]
# where each path decodes, as the report says per slide
DECODED_ON = {"nvjpeg": "gpu", "both": "both", "processes": "cpu", "threads": "cpu", "cut": "cpu"}
# decode="both" hands rows to the decoder processes only for chunks this small (Aperio's
# 240 px tiles, DICOM's 256 px frames): there the engines' cost is per image and the
# processes add to them; a row of larger chunks takes a few processes seconds, and the
# engines decode those chunks fast (H100, 4 CPUs, 1,024 px YCbCr chunks: ViT-S 0.69 of its
# ceiling with the engines alone, 0.33 with the processes beside; ViT-B 0.85 and 0.82;
# bench/RESULTS.md, "decode paths by CPU count").
BOTH_MAX_CHUNK_PIXELS = 256 * 256
AGREE_LEVELS = 2.0  # mean |nvJPEG - libjpeg| a sample chunk may differ by (rounding: < 1)
SAMPLE_CHUNKS = 3  # a plan's first chunks whose nvJPEG decode is checked against libjpeg's


@dataclass(frozen=True)
class DecodePlan:
    """A slide's decoding: the row source, where it decodes and why.

    path: nvjpeg (the GPU's decoder), both (it and the decoder processes side by side),
    processes (decoder processes: chunks read from files, or a slide's tiles read in place
    by byte range), threads (CPU threads: chunks
    not in files of their own), cut (no decoding on the way to the GPU: no CUDA, or a
    level that is not JPEG, cut into batches on CPU threads)."""

    path: DecodePath
    why: str

    @property
    def decoded_on(self) -> str:
        """gpu, both or cpu: the report's word."""
        return DECODED_ON[self.path]

    @property
    def where(self) -> str:
        """Where it decodes, in words: on the GPU, on the GPU and the CPU, on the CPU."""
        return {"gpu": "on the GPU", "both": "on the GPU and the CPU"}.get(
            self.decoded_on, "on the CPU"
        )

    @property
    def on_gpu(self) -> bool:
        return self.path in ("nvjpeg", "both")

    def record(self) -> dict[str, str]:
        return {"decode": self.decoded_on, "decode_path": self.path, "decode_why": self.why}


def decode_plan(
    settings: Settings,
    reader: ChunkReader,
    processes: bool,
    gpu: GpuJpeg | None,
    sample: Sequence[tuple[int, int]] = (),
) -> DecodePlan:
    """The decoding of a level's chunks in a run with these settings. processes: decoder
    processes run; gpu: a GPU JPEG decoder that may be used (None: none, or it failed in
    this run); sample: chunks (row, col) whose nvJPEG decode must agree with libjpeg's
    (none: not checked, as where no decoder runs). GpuDecodeFailed where the GPU's decoder
    fails on the sample: the caller says so and asks again without it."""
    if not settings.cuda:
        return DecodePlan("cut", "no CUDA device: tiles cut on CPU threads")
    if not reader.is_jpeg:
        return DecodePlan("cut", "its chunks are not JPEG: tiles cut on CPU threads")
    on_disk = processes and reader.locations([]) is not None
    cpu = DecodePlan(
        "processes" if on_disk else "threads",
        ("decoder processes" + (", the slide's own tiles by byte range" if reader.frame else ""))
        if on_disk
        else "CPU threads (its chunks are not files)",
    )
    if not gpu_decodes(settings.decode, reader):
        return _because(cpu, f"decode {settings.decode}")
    if gpu is None:
        return _because(cpu, "no GPU JPEG decoder in this run")
    refusal = reader.gpu_refusal()
    if refusal is not None:
        return _because(cpu, f"the GPU's JPEG decoder cannot take it: {refusal}")
    difference = gpu_decode_agrees(gpu, reader, sample, settings.device) if sample else 0.0
    if difference > AGREE_LEVELS:
        why = (
            f"nvJPEG decodes this store's JPEG chunks differently from libjpeg (mean "
            f"|difference| {difference:.1f} levels)"
        )
        return _because(cpu, why)
    small = reader.chunk_h * reader.chunk_w <= BOTH_MAX_CHUNK_PIXELS
    if settings.decode == "both" and on_disk and small:
        return DecodePlan("both", "decode both: nvJPEG and the decoder processes side by side")
    return DecodePlan("nvjpeg", f"decode {settings.decode}: nvJPEG on the GPU")


def _because(plan: DecodePlan, why: str) -> DecodePlan:
    return DecodePlan(plan.path, f"{plan.why} ({why})")


@dataclass(frozen=True)
class SlideDecoding:
    """A slide's decoding as a run decides it (`slide_decoding`): the plan, the GPU
    decoder's failure on the sample (None: it did not fail, or was not asked), and what
    is said of it (None: nothing to say)."""

    plan: DecodePlan
    failure: GpuDecodeFailed | None = None
    said: str | None = None


def slide_decoding(
    settings: Settings,
    reader: ChunkReader,
    processes: bool,
    gpu: GpuJpeg | None,
    tile_plan: TilePlan,
) -> SlideDecoding:
    """The decoding of a plan's level (`decode_plan`), nvJPEG's pixels checked on the plan's
    first `SAMPLE_CHUNKS` chunks; where the GPU decoder fails on them, the plan without it
    (the failure kept: the run uses the decoder no more). One rule for what is said, by
    the run (a warning) and the dry run (a note): a slide the run's decode setting (gpu,
    both) meant for a GPU decoder it has (`gpu`: None once it failed, said then) that is
    decoded on the CPU all the same, and why."""
    asked = gpu is not None and settings.cuda and gpu_decodes(settings.decode, reader)
    # the sample only where the GPU's decoder may be used: the plan's chunks cost a small
    # slide's run some 2 ms of the GIL the GPU loop needs (bench/RESULTS.md, issue 68)
    sample = (
        [tuple(rc) for rc in tile_plan.needed_chunks()[:SAMPLE_CHUNKS].tolist()] if asked else []
    )
    failure = None
    try:
        plan = decode_plan(settings, reader, processes, gpu, sample)
    except GpuDecodeFailed as exc:
        failure = exc
        cpu = decode_plan(settings, reader, processes, None)
        plan = DecodePlan(cpu.path, f"{cpu.why}: {exc}")
    meant = gpu is not None and settings.decode != "cpu"
    said = f"decoded {plan.where} ({plan.why})" if meant and not plan.on_gpu else None
    return SlideDecoding(plan, failure, said)
