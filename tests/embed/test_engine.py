"""The streaming engine on the CPU: equal to the reference loop, stored right, resumable."""

from __future__ import annotations

import json
import os
import socket
import threading
import warnings
from dataclasses import replace

import numpy as np
import pytest
import torch
import xarray as xr
import zarr

from tests.conftest import NDPI, group_of
from tests.corpus import rewrite_chunk
from tilestore.embed import engine
from tilestore.embed.engine import Embedder, embed
from tilestore.embed.models import load_model
from tilestore.embed.nvjpeg import TorchvisionNvjpeg
from tilestore.embed.reference import cosine, reference_features
from tilestore.embed.settings import Options
from tilestore.plan import PlanOptions, load_plan
from tilestore.reading.opening import open_slide

LITE = "efficientnet-lite0"
FP32 = Options(batch_size=8, device="cpu", precision="fp32", dtype="float32")


def _features(store, model=LITE):
    group = zarr.open_group(store / group_of(store, model), mode="r")
    return group["features"][:], group


def test_engine_equals_the_reference_loop_in_fp32(store, lite):
    path = store()
    report = embed([path], lite, plan=PlanOptions(mpp=0.5, tile=224), options=FP32)
    slide = open_slide(path)
    plan, uid = load_plan(slide, "0.5mpp-224px")
    features, group = _features(path)
    assert report.tiles == len(plan) == features.shape[0] and features.shape[1] == 1280
    reference = reference_features(slide, plan, lite)
    assert cosine(features, reference).min() >= 0.9999
    # order and coordinates are the plan's
    np.testing.assert_array_equal(group["x"][:], plan.x)
    np.testing.assert_array_equal(group["y"][:], plan.y)
    np.testing.assert_array_equal(group["row"][:], plan.row)
    np.testing.assert_allclose(group["x_um"][:], plan.x * 0.499)
    attrs = group.attrs["tilestore"]
    assert attrs["complete"] and attrs["plan"] == {"name": plan.name, "uid": uid}
    assert attrs["model"]["transform"]["input_size"] == 224 and attrs["mpp"] == 0.499
    assert group["done"][:].all()


def test_engine_equals_the_reference_loop_in_bf16(store, lite):
    path = store()
    embed(
        [path],
        lite,
        plan=PlanOptions(mpp=1.0, tile=224),
        options=Options(batch_size=4, device="cpu", precision="bf16", dtype="float32"),
    )
    slide = open_slide(path)
    plan, _ = load_plan(slide)
    features, _ = _features(path)
    reference = reference_features(slide, plan, lite, precision="bf16")
    assert cosine(features, reference).min() >= 0.999


def test_plain_xarray_opens_the_embeddings(store, lite):
    path = store()
    embed([path], lite, plan=PlanOptions(mpp=1.0, tile=224), options=FP32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # as the docs show it (guide/embed.md)
        ds = xr.open_zarr(path, group=f"embeddings/{LITE}/1mpp-224px", consolidated=False)
    assert ds["features"].dims == ("tile", "feature")
    assert {"x", "y", "x_um", "y_um", "row", "col"} <= set(ds.coords)
    assert ds.sizes["tile"] == 11 and ds["x"].attrs["units"] == "level-0 pixel"
    assert float(ds.features.isnull().sum()) == 0


def test_two_models_share_a_store_and_a_repeat_is_refused(store, lite):
    path = store()
    options = PlanOptions(mpp=1.0, tile=224)
    first = embed([path], lite, plan=options, options=FP32)
    second = embed([path], "random:vit_tiny_patch16_224", plan=options, options=FP32)
    assert not first.failures and not second.failures
    assert sorted(zarr.open_group(path / "embeddings", mode="r").group_keys()) == [
        LITE,
        "random-vit_tiny_patch16_224",
    ]
    again = embed([path], lite, plan=options, options=FP32)
    assert again.tiles == 0
    assert not again.failures  # a rerun skips what is done, and says so
    assert "is already complete (11 tiles); pass overwrite=True" in again.skipped[0]["why"]
    redo = embed([path], lite, plan=options, options=replace(FP32, overwrite=True))
    assert redo.tiles == 11 and not redo.failures


def test_a_running_embedding_is_not_started_twice(store, lite):
    path = store()
    lock = path.parent / f".{path.name}.{LITE}.1mpp-224px.lock"  # embeddings/<model>/<plan>
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": "now"}))
    report = embed([path], lite, plan=PlanOptions(mpp=1.0, tile=224), options=FP32)
    assert f"is being written by pid {os.getpid()}" in report.failures[0]["error"]
    assert lock.exists()  # someone else's lock is left alone


def _vectra_store(store, folder):
    """A QPTIFF store of three markers (DAPI, CD8, PanCK) from the real DAPI NDPI's pixels."""
    from tests.tilestore import tiffs
    from tilestore.conversion.converter import convert

    ndpi = open_slide(store(NDPI))
    pixels = np.moveaxis(ndpi.to_dask(1).compute(), 0, -1)
    markers = [("DAPI", "0,0,255", 2), ("CD8", "0,255,0", 1), ("PanCK", "255,0,0", 0)]
    planes = {name: (color, pixels[..., i]) for name, color, i in markers}  # DAPI: the blue
    return convert(tiffs.qptiff(folder / "vectra.qptiff", planes), folder / "q").store


def test_a_multiplex_store_is_refused_before_an_rgb_model_sees_it(store, tmp_path, lite):
    """Markers are not colours: a QPTIFF's DAPI, CD8 and PanCK must not be embedded as R, G, B."""
    qptiff = _vectra_store(store, tmp_path)
    cmu = store()
    report = embed([qptiff, cmu], lite, plan=PlanOptions(mpp=1.0, tile=224), options=FP32)
    (failure,) = report.failures
    assert failure["store"] == str(qptiff)
    assert "3 channel(s) (DAPI, CD8, PanCK) of uint8, not an 8-bit RGB picture" in failure["error"]
    assert not (qptiff / "embeddings").exists()
    assert [s["store"] for s in report.slides] == [str(cmu)]
    assert "choose three channels as its R, G, B (channels=A,B,C)" in failure["error"]


class _Windowed:
    """The reference's view of a multiplex store: `channels` in that order, each scaled from
    its omero display window to 0-255, written here from the OME-Zarr metadata alone."""

    def __init__(self, slide, channels):
        shown = slide.group.attrs["ome"]["omero"]["channels"]
        index = {c["label"]: i for i, c in enumerate(shown)}
        self.slide, self.picks = slide, [index[c] for c in channels]
        self.windows = [
            (shown[i]["window"]["start"], shown[i]["window"]["end"]) for i in self.picks
        ]

    def read_region(self, *args, **kwargs):
        raw = self.slide.read_region(*args, **kwargs).astype(np.float64)
        out = [
            np.clip(np.rint((raw[..., i] - lo) * 255 / (hi - lo)), 0, 255)
            for i, (lo, hi) in zip(self.picks, self.windows, strict=True)
        ]
        return np.stack(out, axis=-1).astype(np.uint8)


def test_channels_choose_a_multiplex_stores_rgb_input(store, tmp_path, lite):
    qptiff = _vectra_store(store, tmp_path)
    chosen = ("PanCK", "DAPI", "CD8")  # not the stored order: the order is the model's R, G, B
    options = replace(FP32, channels=chosen)
    plan = PlanOptions(mpp=2.0, tile=224)
    report = embed([qptiff], lite, plan=plan, options=options)
    assert not report.failures and report.tiles > 0
    features, group = _features(qptiff)
    assert group.attrs["tilestore"]["channels"] == list(chosen)  # recorded: resume must match
    slide = open_slide(qptiff)
    tile_plan, _ = load_plan(slide)
    picks = [0, len(tile_plan) // 2, len(tile_plan) - 1]
    expected = reference_features(_Windowed(slide, chosen), tile_plan, lite, indices=picks)
    assert cosine(features[picks], expected).min() >= 0.9999
    # other channels, or none, cannot resume this group; an RGB store has none to choose
    other = embed(
        [qptiff], lite, plan=plan, options=replace(options, channels=("CD8", "DAPI", "PanCK"))
    )
    assert not other.skipped and "is complete but was made otherwise" in other.failures[0]["error"]
    assert (
        "channels: ['PanCK', 'DAPI', 'CD8'], this run ['CD8', 'DAPI', 'PanCK']"
        in (other.failures[0]["error"])
    )
    again = embed([store()], lite, plan=plan, options=options)
    assert "is already an RGB picture; no channels to choose" in again.failures[0]["error"]
    unknown = embed(
        [qptiff], lite, plan=plan, options=replace(options, channels=("DAPI", "CD3", "CD8"))
    )
    assert "no channel 'CD3' (channels: DAPI, CD8, PanCK)" in unknown.failures[0]["error"]


def test_many_slides_one_model_and_a_bad_store_does_not_stop_the_others(store, tmp_path, lite):
    cmu, dapi = store(), store(NDPI)
    missing = tmp_path / "missing.ome.zarr"
    plan = PlanOptions(mpp=1.0, tile=224)
    report = embed([cmu, missing, dapi], lite, plan=plan, options=FP32)
    assert sorted(f["store"] for f in report.failures) == sorted([str(missing), str(dapi)])
    errors = {f["store"]: f["error"] for f in report.failures}
    assert "no such store" in errors[str(missing)]
    # the DAPI scan is stored as RGB: a stained-tissue model reads it only as asked
    assert "a fluorescence scan stored as RGB" in errors[str(dapi)]
    assert "channels=C0,C1,C2" in errors[str(dapi)]
    assert [s["store"] for s in report.slides] == [str(cmu)]
    asked = embed([dapi], lite, plan=plan, options=replace(FP32, channels=("C0", "C1", "C2")))
    assert not asked.failures
    (slide_line,) = asked.slides
    assert slide_line["reading"]["channels"] == ["C0", "C1", "C2"]
    dapi_features, group = _features(dapi)  # zstd store: decoded through zarr
    assert group.attrs["tilestore"]["complete"] and not np.isnan(dapi_features).any()
    slide = open_slide(dapi)
    plan, _ = load_plan(slide)
    picks = [0, len(plan) // 2, len(plan) - 1]
    shown = slide.as_rgb(("C0", "C1", "C2"))  # each channel over its display window
    assert (
        cosine(dapi_features[picks], reference_features(shown, plan, lite, indices=picks)).min()
        >= 0.9999
    )


def test_a_run_with_nothing_to_read_warms_nothing_up(lite, tmp_path):
    report = embed([tmp_path / "missing.ome.zarr"], lite, options=FP32)
    assert "no such store" in report.failures[0]["error"]
    assert report.tiles == 0 and report.first_batch_s is None
    assert "warm_up" not in report.stages  # no compilation for a run that cannot run


def test_report_explains_the_wall_time(store, lite, tmp_path):
    report = embed(
        [store()],
        lite,
        plan=PlanOptions(mpp=1.0, tile=224),
        options=FP32,
        report_path=tmp_path / "run.json",
    )
    parts = sum(report.explained.values())
    assert abs(parts - report.wall_s) < 0.05 * report.wall_s + 0.05
    assert 0 < report.first_batch_s <= report.stages["loop"]
    assert "warm_up" in report.stages  # the model ran once before the first batch came
    saved = json.loads((tmp_path / "run.json").read_text())
    assert saved["tiles"] == 11 and saved["tiles_per_s"] > 0 and saved["peak_rss_mb"] > 0
    assert saved["device"] == "cpu" and saved["decode"] == "cpu"


TINY = "random:vit_small_patch16_224"


@pytest.fixture(scope="module")
def tiny():
    return load_model(TINY)


def test_decoders_default_to_the_cpus_of_the_process_that_embeds(lite, monkeypatch):
    monkeypatch.setattr(engine, "usable_cpus", lambda: 9)  # as a Dask worker pinned to 9
    options = Options(device="cpu", batch_size=2)
    with Embedder(lite, options) as embedder:
        assert embedder.settings.decoders == 7 and options.decoders is None
    with Embedder(lite, replace(options, decoders=3)) as embedder:
        assert embedder.settings.decoders == 3
    with Embedder(lite, options, cpus=5) as embedder:  # a local cluster's share
        assert embedder.settings.decoders == 3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_cuda_engine_equals_the_reference_loop(store, tiny, precision):
    path = store()
    report = embed(
        [path],
        tiny,
        plan=PlanOptions(mpp=0.5, tile=224),
        options=Options(batch_size=16, precision=precision, dtype="float32"),
    )
    assert report.device.startswith("cuda") and not report.failures
    # GPU time from CUDA events, idle gaps between batches included: the parts add up
    assert report.stages["gpu_idle"] >= 0
    assert abs(sum(report.explained.values()) - report.wall_s) < 0.05 * report.wall_s + 0.05
    slide = open_slide(path)
    plan, _ = load_plan(slide)
    features, _ = _features(path, TINY)
    reference = reference_features(slide, plan, tiny, device="cuda", precision=precision)
    assert cosine(features, reference).min() >= (0.9999 if precision == "fp32" else 0.999)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_nvjpeg_decode_matches_cpu_decode_on_a_ycbcr_store(store, tiny, tmp_path):
    cpu = store(copy=False, into=tmp_path / "cpu")  # re-encoded: YCbCr JPEG chunks
    gpu = store(copy=False, into=tmp_path / "gpu")
    report, similarity = _cpu_vs_gpu_decode(cpu, gpu, tiny)
    assert report.decode == "gpu" and not any("nvJPEG" in w for w in report.warnings)
    assert similarity.min() >= 0.999


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("cpus", "want"), [(16, "cpu"), (6, "gpu")])
def test_auto_decode_uses_nvjpeg_where_the_job_has_few_cpus(
    store, tiny, tmp_path, monkeypatch, cpus, want
):
    from tilestore.embed.nvjpeg import OwnNvjpeg

    if want == "gpu" and OwnNvjpeg(torch.device("cuda")).engines[0]:
        want = "both"  # beside the decoder processes, where the GPU has JPEG engines
    monkeypatch.setattr("tilestore.embed.engine.usable_cpus", lambda: cpus)
    small = store(copy=False, into=tmp_path / "small")  # YCbCr, 256 px chunks
    big = store(copy=False, chunk=512, into=tmp_path / "big")  # YCbCr, 512 px chunks
    options = Options(batch_size=16, dtype="float32", overwrite=True)
    report = embed([small, big], tiny, plan=PlanOptions(mpp=0.5, tile=224), options=options)
    assert report.decode == want and not report.failures
    # decode both leaves the 512 px chunks to the engines alone (BOTH_MAX_CHUNK_PIXELS)
    assert [s["decode"] for s in report.slides] == [want, "gpu" if want == "both" else want]
    assert (report.gpu_decoder is not None) == (want != "cpu")
    assert f"{cpus} CPUs" in report.decode_why
    assert not any("nvJPEG" in w for w in report.warnings)
    slide = open_slide(big)
    reference = reference_features(
        slide, load_plan(slide)[0], tiny, device="cuda", precision="fp32"
    )
    assert cosine(_features(big, TINY)[0], reference).min() >= 0.999


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_auto_decode_on_few_cpus_without_nvjpeg_decodes_on_the_cpu(store, tiny, monkeypatch):
    """auto asks for nvJPEG on few CPUs but does not need it: where no decoder starts (as
    on ROCm), the run decodes on the CPU rather than failing."""

    def no_nvjpeg(*args, **kwargs):
        raise RuntimeError("Not compiled with GPU support")

    monkeypatch.setattr("tilestore.embed.engine.usable_cpus", lambda: 4)
    monkeypatch.setattr("tilestore.embed.nvjpeglib.find_library", lambda: None)
    monkeypatch.setattr("torchvision.io.decode_jpeg", no_nvjpeg)
    options = Options(batch_size=16, dtype="float32")
    report = embed([store(copy=False)], tiny, plan=PlanOptions(mpp=0.5, tile=224), options=options)
    assert report.decode == "cpu" and report.gpu_decoder is None and not report.failures
    assert [s["decode"] for s in report.slides] == ["cpu"] and report.tiles > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_rgb_coded_chunks_are_decoded_on_the_gpu_as_coded(store, tiny, tmp_path):
    cpu, gpu = store(into=tmp_path / "cpu"), store(into=tmp_path / "gpu")  # Aperio RGB JPEG
    report, similarity = _cpu_vs_gpu_decode(cpu, gpu, tiny)
    assert [s["decode"] for s in report.slides] == ["gpu"]
    assert "nvJPEG" in report.gpu_decoder and not any("CPU" in w for w in report.warnings)
    assert similarity.min() >= 0.999


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_rgb_coded_chunks_fall_back_to_cpu_decode_through_torchvision(
    store, tiny, tmp_path, monkeypatch
):
    monkeypatch.setattr("tilestore.embed.nvjpeg.GPU_DECODERS", (TorchvisionNvjpeg,))
    cpu, gpu = store(into=tmp_path / "cpu"), store(into=tmp_path / "gpu")  # Aperio RGB JPEG
    report, similarity = _cpu_vs_gpu_decode(cpu, gpu, tiny)
    assert report.gpu_decoder == "torchvision"
    assert any("decoded on the CPU" in w for w in report.warnings)
    assert similarity.min() >= 0.9999


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("copy", [True, False], ids=["rgb-coded", "ycbcr"])
def test_decode_both_splits_rows_between_cpu_and_gpu_with_the_cpus_features(
    store, tiny, tmp_path, monkeypatch, copy
):
    from tilestore.embed.rows import BothRows

    split: dict[str, int] = {}
    close = BothRows.close

    def closing(self):
        split.update(self.rows)
        close(self)

    monkeypatch.setattr(BothRows, "close", closing)
    # the slide's grid rows one by one (not joined into one step, as a small slide's are)
    monkeypatch.setattr("tilestore.embed.readout.JOIN_PIXELS", 0)
    cpu, gpu = store(copy=copy, into=tmp_path / "cpu"), store(copy=copy, into=tmp_path / "gpu")
    # two processes have room for two rows: the slide's other rows go to nvJPEG
    report, similarity = _cpu_vs_gpu_decode(cpu, gpu, tiny, decode="both", decoders=2)
    assert [s["decode"] for s in report.slides] == ["both"]
    assert not any("CPU" in w or "nvJPEG" in w for w in report.warnings)
    assert split["cpu"] > 0 and split["gpu"] > 0  # each decoded some of the rows
    assert similarity.min() >= 0.999


def _cpu_vs_gpu_decode(cpu, gpu, model, decode="gpu", **extra):
    """Embed one store with --decode cpu, its twin with --decode `decode` (and the `extra`
    options); the second run's report and the per-tile cosine between the two."""
    plan = PlanOptions(mpp=0.5, tile=224)
    for path, way in ((cpu, "cpu"), (gpu, decode)):
        options = Options(batch_size=16, decode=way, dtype="float32", **extra)
        report = embed([path], model, plan=plan, options=options)
    return report, cosine(_features(cpu, TINY)[0], _features(gpu, TINY)[0])


def test_rows_spanning_more_batches_than_buffers_do_not_deadlock(store, lite):
    import threading

    path = store()
    outcome = {}

    def run():
        outcome["report"] = embed(
            [path],
            lite,
            plan=PlanOptions(mpp=0.5, tile=224),
            options=Options(
                batch_size=1,
                device="cpu",
                precision="fp32",
                dtype="float32",
                prefetch=1,
                readers=1,
                decoders=2,
            ),
        )

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout=300)
    assert not worker.is_alive(), "the engine deadlocked"
    assert outcome["report"].tiles == 45  # every row spans ~9 batches, with 1 + 1 + 2 buffers
    features, _ = _features(path)
    slide = open_slide(path)
    plan, _ = load_plan(slide)
    assert cosine(features, reference_features(slide, plan, lite)).min() >= 0.9999


def test_a_compiled_run_equals_the_reference_loop(store, tmp_path):
    """--compile fuses the transform with the model: one graph for uint8 batches, equal to
    the eager reference (the GPU where there is one). The compiled graphs are kept in the
    compile cache, and the next run loads them, with the same features."""
    model = load_model("random:vit_tiny_patch16_224")
    path = store()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cache = tmp_path / "compiled"
    options = Options(
        batch_size=16, device=device, precision="fp32", compile=True, compile_cache=str(cache)
    )
    report = embed([path], model, plan=PlanOptions(mpp=0.5, tile=224), options=options)
    assert report.compile and not report.failures
    assert any(n.startswith(f"compile cache: saved {cache}") for n in report.notes), report.notes
    (entry,) = cache.glob("*.bin")
    again = embed(
        [path], model, plan=PlanOptions(mpp=0.5, tile=224), options=replace(options, overwrite=True)
    )
    assert f"compile cache: loaded {entry}" in " ".join(again.notes), again.notes
    slide = open_slide(path)
    plan, _ = load_plan(slide, "0.5mpp-224px")
    features, _ = _features(path, "random:vit_tiny_patch16_224")
    reference = reference_features(slide, plan, model, device=device)
    assert cosine(features, reference).min() >= 0.999


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_compiled_cuda_run_replays_one_graph_from_any_thread(store, tmp_path):
    """On a GPU --compile replays a CUDA graph per batch, whose output the next replay
    overwrites: each batch must be copied out first. A Dask worker may call its Embedder
    from different threads, so two slides are embedded from two threads in turn."""
    model = load_model("random:vit_tiny_patch16_224")
    paths = [store(into=tmp_path / name) for name in ("a", "b")]
    options = Options(batch_size=16, precision="fp32", dtype="float32", compile=True)
    reports = []
    with Embedder(model, options) as embedder:
        for path in paths:
            options = PlanOptions(mpp=0.5, tile=224)
            thread = threading.Thread(
                target=lambda p=path, o=options: reports.append(embedder.embed([p], plan=o))
            )
            thread.start()
            thread.join()
        graphs = embedder.runner.forward.whole.graphs
    slide = open_slide(paths[0])
    plan, _ = load_plan(slide)
    assert [r.tiles for r in reports] == [len(plan)] * 2 and len(plan) > 2 * 16
    assert not any(r.failures for r in reports)
    assert len(graphs) == 1  # captured at the warm-up, replayed by both threads
    reference = reference_features(slide, plan, model, device="cuda")
    for path in paths:
        features, _ = _features(path, "random:vit_tiny_patch16_224")
        assert cosine(features, reference).min() >= 0.9999


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("decode", ["cpu", "gpu"])
@pytest.mark.parametrize(
    ("damage", "cause"),
    [("flip", "chunk is corrupt"), ("sealed-garbage", "cannot decode")],
)
def test_a_damaged_chunk_fails_its_slide_on_the_gpu_paths(
    store, tiny, tmp_path, decode, damage, cause
):
    """Decoder processes (decode cpu on CUDA) and nvJPEG name the chunk; the next slide runs."""
    from tilestore.format.integrity import seal

    bad = store(copy=False, into=tmp_path / "bad")  # YCbCr chunks: nvJPEG decodes them
    good = store(copy=False, into=tmp_path / "good")

    def change(data: bytes) -> bytes:
        if damage == "flip":
            flipped = bytearray(data)
            flipped[len(data) // 2] ^= 1
            return bytes(flipped)
        return seal(bytes(range(256)) * 8)  # damaged before it was written: CRC right, JPEG not

    rewrite_chunk(bad, change)  # chunk (2, 3)
    options = Options(batch_size=16, decode=decode, dtype="float32")
    report = embed([bad, good], tiny, plan=PlanOptions(mpp=0.5, tile=224), options=options)
    assert len(report.failures) == 1, report.failures
    (failure,) = report.failures
    assert failure["store"] == str(bad) and cause in failure["error"]
    # nvJPEG decodes several chunks per call: where it fails, the CPU names the chunk
    assert failure["error"].startswith("level 0 chunk (2, 3): ")
    assert [s["store"] for s in report.slides if not s.get("failed")] == [str(good)]
    assert _features(good, TINY)[1].attrs["tilestore"]["complete"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_where_nvjpeg_itself_fails_the_cpu_finishes_the_slide_and_the_run(
    store, tiny, tmp_path, monkeypatch
):
    """Seen on an H100 after many batches of changing size: nvJPEG's allocator fails. The
    slide is finished on the CPU decoders, and nvJPEG is not asked again in the run."""
    from tilestore.embed.nvjpeg import GPU_DECODERS
    from tilestore.embed.nvjpeglib import NvjpegError

    failed, after = [], []

    def failing_for(original):
        def failing(self, reader, data):
            if failed:
                after.append(len(data))
            elif threading.current_thread().name == "tilestore-nvjpeg":  # decoding rows
                failed.append(type(self).__name__)
                raise NvjpegError("nvJPEG could not decode a batch: allocator failure", 5)
            return original(self, reader, data)

        return failing

    # whichever decoder starts (ours, or torchvision's where ours will not in this process)
    for kind in GPU_DECODERS:
        monkeypatch.setattr(kind, "decode", failing_for(kind.decode))
    first = store(copy=False, into=tmp_path / "first")
    second = store(copy=False, into=tmp_path / "second")
    options = Options(batch_size=16, decode="gpu", precision="fp32", dtype="float32")
    plan = PlanOptions(mpp=0.5, tile=224)
    report = embed([first, second], tiny, plan=plan, options=options)
    # nvJPEG not asked again (the report's warnings say why a slide went to the CPU)
    assert not report.failures and failed and after == [], (report.warnings, report.decode)
    assert any("allocator failure" in w and "decoded on the CPU" in w for w in report.warnings)
    slide = open_slide(first)
    reference = reference_features(slide, load_plan(slide)[0], tiny, device="cuda")
    for path in (first, second):
        assert cosine(_features(path, TINY)[0], reference).min() >= 0.999


def test_a_run_times_the_collectors_passes():
    """Each pass of the garbage collector during a run (it holds the GIL: every thread
    waits) is timed as the stage "gc"; afterwards the collector is as it was."""
    import gc

    from tilestore.embed.report import Stats
    from tilestore.embed.runner import _timed_collector

    callbacks = list(gc.callbacks)
    stats = Stats()
    with _timed_collector(stats):
        gc.collect()
    assert stats.get("gc") > 0 and gc.callbacks == callbacks
