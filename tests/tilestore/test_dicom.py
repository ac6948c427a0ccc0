"""DICOM WSI input: the real CAMELYON file, and multi-level series that wsidicomizer makes from
the real SVS (JPEG baseline, JPEG 2000, uncompressed). Pixels are checked against wsidicom's
own reads: equal where frames are copied, PSNR where they are decoded and re-encoded."""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pydicom
import pytest
from wsidicom import WsiDicom

from tests.conftest import CMU, DATA, psnr
from tilestore.conversion.converter import convert
from tilestore.errors import SlideError
from tilestore.reading.opening import open_slide
from tilestore.sources import dicom_series, open_source

CAMELYON = DATA / "slides" / "camelyon_lymphnode_jpeg.dcm"


def _dicomize(src, folder, **options):
    wsidicomizer = pytest.importorskip("wsidicomizer")
    from wsidicomizer.sources import TiffSlideSource  # pure Python: no libturbojpeg needed

    wsidicomizer.WsiDicomizer.convert(
        src, folder, tile_size=256, preferred_source=TiffSlideSource, **options
    )
    return folder


@pytest.fixture(scope="module")
def pyramid(tmp_path_factory, slide_path):
    """Five levels of JPEG baseline frames (YBR_FULL_422) with a label and an overview."""
    folder = tmp_path_factory.mktemp("dicom") / "cmu"
    return _dicomize(slide_path(CMU), folder, add_missing_levels=True)


def _reference(folder_or_file, index):
    with WsiDicom.open(folder_or_file) as wsi:
        level = list(wsi.levels)[index]
        size = (level.size.width, level.size.height)
        return np.asarray(wsi.read_region((0, 0), level.level, size))


def _stored(store, index):
    return np.moveaxis(open_slide(store).to_dask(index).compute(), 0, -1)


def test_the_real_dicom_file_converts_by_copying_its_frames(tmp_path):
    if not CAMELYON.exists():
        pytest.skip(f"real test data not found: {CAMELYON}")
    report = convert(CAMELYON, tmp_path)
    assert report.levels[0].write == "copy" and report.levels[0].reencoded == 0
    np.testing.assert_array_equal(_stored(report.store, 0), _reference(CAMELYON, 0))
    slide = open_slide(report.store)
    assert slide.mpp == pytest.approx((28.969, 28.968), abs=1e-3)  # PixelSpacing, mm -> µm


def test_a_multi_level_series_keeps_its_pyramid(pyramid, tmp_path):
    report = convert(pyramid, tmp_path)
    with open_source(pyramid) as source:
        assert source.info.format == "dicom" and len(source.levels) == 5
        assert source.info.series and set(source.associated) == {"label", "macro"}
    assert [lv.write for lv in report.levels] == ["copy"] * 5
    assert report.store.name == "cmu.ome.zarr"
    np.testing.assert_array_equal(_stored(report.store, 0), _reference(pyramid, 0))
    for index in range(1, 5):  # wsidicomizer writes short frames at the right edge: re-encoded
        assert psnr(_stored(report.store, index), _reference(pyramid, index)) >= 40
    record = open_slide(report.store).record
    assert record.get("associated") == [] and record.source.facts["files"] == 8
    assert record.source.facts["series"] == source.info.series


def test_frames_are_read_at_their_offsets_not_one_by_one_through_wsidicom(
    pyramid, tmp_path, monkeypatch
):
    """The copy path reads frames with os.pread from wsidicom's frame index (threads at once);
    wsidicom's locked per-frame read made DICOM copying 3x slower than SVS."""

    def refuse(*args, **kwargs):
        raise AssertionError("read_encoded_tile called")

    monkeypatch.setattr(WsiDicom, "read_encoded_tile", refuse)
    report = convert(pyramid, tmp_path)
    assert report.levels[0].write == "copy"
    np.testing.assert_array_equal(_stored(report.store, 0), _reference(pyramid, 0))


def test_label_and_overview_only_when_asked_for(pyramid, tmp_path):
    report = convert(pyramid, tmp_path, keep_associated=True)
    assert open_slide(report.store).record.get("associated") == ["label", "macro"]


@pytest.mark.parametrize(
    ("kind", "syntax"),
    [
        ("jpeg2000", "1.2.840.10008.1.2.4.90 (JPEG 2000 lossless)"),
        ("uncompressed", "1.2.840.10008.1.2.1 (uncompressed (explicit VR))"),
    ],
)
def test_lossless_frames_stay_lossless_and_jpeg_asked_for_says_its_loss(
    kind, syntax, tmp_path, slide_path
):
    """A J2K-lossless (or uncompressed) series converts to wsidicom's pixels exactly; it was
    JPEG by default before (40.5 dB, and said "re-encode", never "lossy"). JPEG asked for
    is re-encoded, and the report says LOSSY with its PSNR."""
    from wsidicom.codec import Jpeg2kSettings, NumpySettings

    encoding = Jpeg2kSettings(levels=[0]) if kind == "jpeg2000" else NumpySettings()
    folder = _dicomize(
        slide_path(CMU),
        tmp_path / kind,
        encoding=encoding,
        force_transcoding=True,
        include_label=False,
        include_overview=False,
        include_thumbnail=False,
    )
    report = convert(folder, tmp_path / "out")
    assert report.codec == "zstd" and not report.lossy
    assert (
        report.codec_reason == f"stored losslessly, kept lossless: DICOM transfer syntax {syntax}"
    )
    assert report.levels[0].write == "lossless"
    np.testing.assert_array_equal(_stored(report.store, 0), _reference(folder, 0))
    lossy = convert(folder, tmp_path / "jpeg", codec="jpeg")
    level0 = lossy.levels[0]
    assert level0.write == "re-encode" and "not JPEG baseline" in level0.reason
    assert level0.lossy and level0.sampled == 64  # of CMU's 9 x 12 chunks of 256 px
    assert level0.psnr == pytest.approx(psnr(_stored(lossy.store, 0), _reference(folder, 0)), abs=1)
    assert level0.psnr >= 40
    assert lossy.summary().startswith(
        f"codec jpeg q95 (asked for): LOSSY, level 0 PSNR {level0.psnr:.1f} dB (64 chunks sampled)"
    )


def test_jpeg_2000_frames_of_the_lossy_or_lossless_syntax_are_judged_by_their_cod(
    tmp_path, slide_path
):
    """Transfer syntax .91 may hold either: its first frame's COD marker says which."""
    from wsidicom.codec import Jpeg2kSettings

    folder = _dicomize(
        slide_path(CMU),
        tmp_path / "lossy",
        encoding=Jpeg2kSettings(levels=[60]),
        force_transcoding=True,
        include_label=False,
        include_overview=False,
        include_thumbnail=False,
    )
    with open_source(folder) as source:
        fact = source.levels[0].lossless
    assert fact.value is False
    assert fact.origin == (
        "DICOM transfer syntax 1.2.840.10008.1.2.4.91 (JPEG 2000, lossless or lossy): "
        "irreversible 9-7 wavelet (COD marker of the first tile)"
    )


def test_a_folder_of_two_series_makes_a_store_of_each(pyramid, tmp_path):
    if not CAMELYON.exists():
        pytest.skip(f"real test data not found: {CAMELYON}")
    folder = tmp_path / "two"
    shutil.copytree(pyramid, folder)
    shutil.copy(CAMELYON, folder)
    (folder / "notes.txt").write_text("not DICOM")
    series = dicom_series(folder)
    assert len(series) == 2
    with pytest.raises(SlideError, match="holds 2 DICOM series"):
        open_source(folder)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "tilestore.cli",
            "convert",
            str(folder),
            "-o",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == sorted(f"two-{uid}.ome.zarr" for uid in series)


def test_a_folder_of_dicom_and_other_slides_is_refused_naming_them(tmp_path, slide_path):
    """It was taken for one DICOM slide: the DICOM converted, the SVS and NDPI beside it left
    out without a word (exit 0)."""
    folder = tmp_path / "mixed"
    folder.mkdir()
    for name in ("camelyon_lymphnode_jpeg.dcm", CMU, "stritt_test3-DAPI-2-387.ndpi"):
        (folder / name).symlink_to(slide_path(name))
    (folder / "notes.txt").write_text("not a slide")  # other files are no slides: left out
    said = (
        rf"^{folder}: the folder holds 1 DICOM file\(s\) and 2 slide\(s\) of other formats "
        rf"\({CMU}, stritt_test3-DAPI-2-387\.ndpi\), which a folder taken as a DICOM slide "
        rf"would leave out: give the slide files themselves \({folder}/\*\), or a folder "
        r"holding only DICOM files$"
    )
    with pytest.raises(SlideError, match=said):
        convert(folder, tmp_path / "out")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "tilestore.cli",
            "convert",
            str(folder),
            "-o",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 2 and run.stderr.strip().count("\n") == 0, run.stderr
    assert f"{folder}: the folder holds 1 DICOM file(s) and 2 slide(s)" in run.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    (folder / CMU).unlink()
    (folder / "stritt_test3-DAPI-2-387.ndpi").unlink()
    assert [p.name for p in dicom_series(folder)[next(iter(dicom_series(folder)))]] == [
        "camelyon_lymphnode_jpeg.dcm"
    ]  # DICOM and files that are no slides: a DICOM slide, as before


def test_damaged_dicom_is_one_clear_error(tmp_path):
    if not CAMELYON.exists():
        pytest.skip(f"real test data not found: {CAMELYON}")
    data = CAMELYON.read_bytes()
    cut = tmp_path / "cut.dcm"
    cut.write_bytes(data[: len(data) // 2])
    garbage = tmp_path / "garbage.dcm"
    garbage.write_bytes(data[:132] + bytes(range(256)) * 16)
    # a DICOM that is not a slide: a CT-like image
    ds = pydicom.Dataset()
    ds.file_meta = pydicom.dataset.FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = pydicom.uid.ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID = pydicom.uid.CTImageStorage
    ds.SOPClassUID, ds.SOPInstanceUID = pydicom.uid.CTImageStorage, pydicom.uid.generate_uid()
    ds.SeriesInstanceUID, ds.StudyInstanceUID = (
        pydicom.uid.generate_uid(),
        pydicom.uid.generate_uid(),
    )
    ds.Modality, ds.Rows, ds.Columns = "CT", 8, 8
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 0
    ds.PixelData = np.zeros((8, 8), np.uint16).tobytes()
    ct = tmp_path / "ct.dcm"
    ds.save_as(ct, enforce_file_format=True)
    for bad in (cut, garbage, ct):
        with pytest.raises(SlideError) as caught:
            convert(bad, tmp_path / "out")
        message = str(caught.value)
        assert message.startswith(f"{bad}: ") and "\n" not in message, message
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
