"""Settings resolved once: every "auto" and None decided from the options and the machine."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.embed.conftest import Machine
from tilestore.embed.settings import Options, Settings, resolve
from tilestore.errors import TilestoreError


@pytest.mark.parametrize(
    ("option", "cuda", "nvjpeg", "engines", "cpus", "want", "why"),
    [
        ("auto", False, True, 7, 16, "cpu", "no CUDA device"),  # nothing else can decode
        ("auto", False, True, 7, 2, "cpu", "no CUDA device"),
        ("auto", True, True, 7, 16, "cpu", "16 CPUs: 14 decoder processes keep up"),
        ("auto", True, True, 7, 8, "cpu", "8 CPUs: 6 decoder processes keep up"),
        # too few CPUs: the processes and the JPEG engines together
        ("auto", True, True, 7, 7, "both", "7 CPUs and 7 JPEG engines"),
        ("auto", True, True, 1, 3, "both", "3 CPUs and 1 JPEG engines"),
        ("auto", True, True, 0, 3, "gpu", "3 CPUs, no JPEG engines"),  # nvJPEG's CUDA path
        ("auto", True, False, 7, 3, "cpu", "no GPU JPEG decoder"),  # none starts (ROCm)
        ("auto", True, False, 7, 16, "cpu", "16 CPUs"),
        ("cpu", True, True, 7, 3, "cpu", "asked for"),  # as asked
        ("gpu", True, True, 7, 16, "gpu", "asked for"),
        ("both", True, True, 0, 16, "both", "asked for"),
    ],
)
@pytest.mark.parametrize("rate", [None, 20_000.0])  # the model's: unknown, or fast
def test_decode_resolves_by_device_cpus_and_engines(
    option, cuda, nvjpeg, engines, cpus, want, why, rate
):
    machine = Machine(
        cuda=0 if cuda else None,
        cpus=cpus,
        gpu_jpeg="nvJPEG" if nvjpeg else None,
        engines=engines,
        rate=rate,
    )
    settings = resolve(Options(decode=option, batch_size=8), machine)
    assert settings.decode == want
    assert settings.decode_why.startswith(why)
    assert settings.gpu_decoder == ("nvJPEG" if want in ("gpu", "both") else None)


@pytest.mark.parametrize(
    ("rate", "cpus", "want"),
    [
        (3_668.0, 4, "cpu"),  # ViT-L: 2 decoder processes keep up (5,400 tiles/s)
        (5_400.0, 4, "cpu"),
        (5_500.0, 4, "both"),  # just past what they feed
        (10_775.0, 4, "both"),  # ViT-B
        (10_775.0, 7, "cpu"),  # 5 processes: 13,500 tiles/s
        (28_114.0, 7, "both"),  # ViT-S outruns them
    ],
)
def test_auto_decode_leaves_a_slow_model_to_the_cpu(rate, cpus, want):
    machine = Machine(cuda=0, cpus=cpus, engines=7, rate=rate)
    settings = resolve(Options(batch_size=8), machine)
    assert settings.decode == want
    if want == "cpu":
        assert f"{rate:,.0f} tiles/s alone" in settings.decode_why
        assert not any(a.startswith("gpu_jpeg") for a in machine.asked)  # never started


def test_nvjpeg_is_started_only_where_it_may_decode():
    machine = Machine(cuda=0, cpus=16)
    resolve(Options(decode="auto", batch_size=8), machine)
    resolve(Options(decode="cpu", batch_size=8), machine)
    assert not any(a.startswith("gpu_jpeg") for a in machine.asked)
    resolve(Options(decode="gpu", batch_size=8), machine)
    assert machine.asked.count("gpu_jpeg(required=True)") == 1
    resolve(Options(decode="both", batch_size=8), machine)
    assert machine.asked.count("gpu_jpeg(required=True)") == 2
    assert "jpeg_engines" not in machine.asked  # asked only to decide "auto"


def test_nvjpeg_asked_for_and_missing_is_an_error():
    with pytest.raises(RuntimeError, match="no nvJPEG decoder"):
        resolve(Options(decode="gpu", batch_size=8), Machine(cuda=0, gpu_jpeg=None))


def test_bad_options_are_one_line_errors_naming_the_parameter():
    machine = Machine(cuda=0)
    cases = {
        "decode": ("nvdec", r"^decode='nvdec': must be one of 'auto', 'cpu', 'gpu', 'both'$"),
        "precision": ("fp16", r"^precision='fp16': must be one of 'auto', 'bf16', 'fp32'$"),
        "dtype": ("int8", r"^dtype='int8': must be one of 'float16', 'float32'$"),
        "device": ("tpu", r"^device='tpu': must be 'auto', 'cpu', 'cuda' or 'cuda:N'$"),
        "batch_size": (0, r"^batch_size=0: must be a whole number from 1 to 65,536, or 'auto'$"),
        "readers": (-1, r"^readers=-1: must be a whole number from 1 to 1,024$"),
    }
    for field, (value, message) in cases.items():
        with pytest.raises(TilestoreError, match=message):
            resolve(Options(**{field: value}), machine)
    for option in ("gpu", "both"):
        with pytest.raises(TilestoreError, match=rf"^decode='{option}' needs a CUDA device$"):
            resolve(Options(decode=option), Machine(cuda=None))
    with pytest.raises(TilestoreError, match=r"^device='cuda': no CUDA device is visible"):
        resolve(Options(device="cuda"), Machine(cuda=None))


def test_device_precision_and_decoders_follow_the_machine():
    on_gpu = resolve(Options(batch_size=8), Machine(cuda=1, cpus=9))
    assert on_gpu.device == torch.device("cuda", 1)  # the current device, by index
    assert on_gpu.precision == "bf16" and on_gpu.decoders == 7  # CPUs less two
    on_cpu = resolve(Options(batch_size=8), Machine(cuda=None, cpus=3))
    assert on_cpu.device == torch.device("cpu") and on_cpu.precision == "fp32"
    assert on_cpu.decoders == 2  # never fewer than two
    assert resolve(Options(decoders=5, batch_size=8), Machine(cpus=64)).decoders == 5
    assert resolve(Options(device="cuda:0", batch_size=8), Machine(cuda=1)).device.index == 0


def test_the_batch_size_is_measured_only_on_a_gpu_and_only_when_not_given():
    gpu = Machine(cuda=0, best_batch=512)
    assert resolve(Options(), gpu).batch_size == 512
    assert gpu.asked.count("best_batch(cuda:0, bf16)") == 1
    given = Machine(cuda=0)
    assert resolve(Options(batch_size=48), given).batch_size == 48
    assert not any(a.startswith("best_batch") for a in given.asked)
    cpu = Machine(cuda=None)
    assert resolve(Options(), cpu).batch_size == 32
    assert not any(a.startswith("best_batch") for a in cpu.asked)


def test_decoders_start_before_anything_that_needs_the_model():
    """Their processes import while nvJPEG starts and the model loads for the batch size."""
    gpu = Machine(cuda=0, cpus=16)
    settings = resolve(Options(decode="gpu"), gpu)
    started = gpu.asked.index("start_decoders(14)")
    assert started < gpu.asked.index("gpu_jpeg(required=True)")
    assert started < gpu.asked.index("best_batch(cuda:0, bf16)")
    assert settings.decoders == 14 and gpu.asked.count("start_decoders(14)") == 1
    cpu = Machine(cuda=None)
    resolve(Options(), cpu)
    assert not any(a.startswith("start_decoders") for a in cpu.asked)  # threads on the CPU


def test_settings_are_frozen():
    settings = resolve(Options(batch_size=8), Machine())
    assert isinstance(settings, Settings)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.decode = "gpu"  # type: ignore[misc]
