"""Which readers there are: each reader's module declares what it opens (`Reader`: marks,
`guess_can_open`, priority; xarray's backend entry points as the model) and this tuple
lists them, in the order the refusal of a file none opens names them. A new reader is a
module of its own and a line here."""

from __future__ import annotations

from pathlib import Path

from tilestore.sources import anytiff, dicom, image, openslide_reader
from tilestore.sources.base import Reader

READERS: tuple[Reader, ...] = (
    anytiff.READER,
    dicom.READER,
    openslide_reader.READER,
    image.READER,
)


def reader_for(path: Path, head: bytes) -> Reader | None:
    """The reader of lowest priority that guesses it can open the file, None if none does."""
    return next(
        (r for r in sorted(READERS, key=lambda r: r.priority) if r.guess_can_open(path, head)),
        None,
    )


def supported() -> str:
    """The formats the readers open, as a refusal lists them."""
    return ", ".join(reader.opens for reader in READERS)


def marked_by_another(path: Path, head: bytes) -> bool:
    """Whether a file that is not DICOM is marked (its first bytes, or its name for the
    OpenSlide formats that are not TIFFs) as a slide another reader opens."""
    return any(reader.marks(path, head) for reader in READERS if reader is not dicom.READER)
