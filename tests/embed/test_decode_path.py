"""Which row source makes a slide's tiles: decided by one function, `decode_plan`, with the
report's word and why on its record; the run, its fallback and the dry run ask it alike."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tilestore.embed.decodeplan import DecodePlan, decode_plan

GPU = object()  # a GPU JPEG decoder that may be used


def _reader(jpeg: bool, files: bool, chunk: int = 240, refusal: str | None = None):
    return SimpleNamespace(
        is_jpeg=jpeg,
        channels=3,
        locations=lambda chunks: [] if files else None,
        frame=None,  # a store's own chunks (a slide read in place: its tiles' frame)
        chunk_h=chunk,
        chunk_w=chunk,
        gpu_refusal=lambda: refusal,
    )


@pytest.mark.parametrize(
    ("cuda", "decode", "jpeg", "gpu", "refusal", "processes", "files", "path"),
    [
        (False, "cpu", True, None, None, False, True, "cut"),  # no GPU: cut on CPU threads
        (True, "gpu", False, GPU, None, True, True, "cut"),  # a zstd level: cut, even on CUDA
        (True, "gpu", True, GPU, None, True, True, "nvjpeg"),
        (True, "both", True, GPU, None, True, True, "both"),  # processes and nvJPEG
        (True, "both", True, GPU, None, True, False, "nvjpeg"),  # no chunk files: nvJPEG alone
        (True, "both", True, GPU, None, False, True, "nvjpeg"),  # no decoder processes
        (True, "both", True, GPU, "progressive", True, True, "processes"),  # frames it refuses
        (True, "gpu", True, None, None, True, True, "processes"),  # the decoder failed earlier
        (True, "cpu", True, GPU, None, True, True, "processes"),  # chunk files the workers read
        (True, "cpu", True, None, None, True, False, "threads"),  # chunks not on disk (in place)
        (True, "cpu", True, None, None, False, True, "threads"),  # no decoder processes started
    ],
)
def test_decode_plan(cuda, decode, jpeg, gpu, refusal, processes, files, path):
    settings = SimpleNamespace(cuda=cuda, decode=decode)
    plan = decode_plan(settings, _reader(jpeg, files, refusal=refusal), processes, gpu)
    assert plan.path == path
    assert plan.decoded_on == {"nvjpeg": "gpu", "both": "both"}.get(path, "cpu")
    assert plan.why  # the report says why, every time
    if refusal:
        assert refusal in plan.why


@pytest.mark.parametrize(("chunk", "path"), [(240, "both"), (256, "both"), (512, "nvjpeg")])
def test_decode_both_leaves_large_chunks_to_the_engines(chunk, path):
    """A row of large chunks would take the few decoder processes seconds: the engines
    alone decode it (measured: 1,024 px chunks, ViT-S 0.69 of its ceiling vs 0.33)."""
    settings = SimpleNamespace(cuda=True, decode="both")
    assert decode_plan(settings, _reader(True, True, chunk), True, GPU).path == path


def test_the_record_is_the_reports_words():
    plan = DecodePlan("processes", "decoder processes (decode cpu)")
    assert plan.record() == {
        "decode": "cpu",
        "decode_path": "processes",
        "decode_why": "decoder processes (decode cpu)",
    }


def test_a_slide_read_in_place_goes_to_the_decoder_processes(tmp_path):
    """Read in place, an SVS's JPEG tiles are byte ranges of its file: the decoder processes
    take them (not threads in the process that launches the GPU's work), and the report
    says so; without decoder processes, threads."""
    from tests.conftest import CMU, SLIDES
    from tilestore.conversion import open_in_place

    reader = open_in_place(SLIDES / CMU, sidecars=tmp_path).chunks(0)
    settings = SimpleNamespace(cuda=True, decode="cpu")
    plan = decode_plan(settings, reader, True, None)
    assert plan.path == "processes"
    assert "the slide's own tiles by byte range" in plan.why
    assert decode_plan(settings, reader, False, None).path == "threads"
