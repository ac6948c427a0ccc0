"""What a lossy (JPEG) level lost: the PSNR of a sample of its chunks, read back as they were
written and compared with the pixels they were encoded from.

The sample is `SAMPLE_CHUNKS` chunks drawn at random (seeded: the same level, the same
chunks) over the level's grid, so its cost is bounded whatever the slide's size, and PSNR is
taken over the sample's pixels together (their mean squared error), as a level's PSNR over
all its pixels is. Measured (`bench/loss_sample.py`, JPEG q95, 2 shared cores; the table in
bench/RESULTS.md): 64 chunks of 256 px came within 0.41 dB of the PSNR of every chunk of
levels of 108-2,209 chunks of H&E, H&E on 64 px chunks and a fluorescence slide, and within
1.23 dB on a slide that is glass but for one small fragment (its few tissue chunks carry the
error); reading them back cost 0.04-0.6 s a slide, against 1.4-15 s of conversion. Fewer
chunks would make the tissue-poor case worse; more would cost decoding without telling the
user more than "about 40 dB" or "about 47 dB".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import zarr

from tilestore.format.chunks import ChunkReader

SAMPLE_CHUNKS = 64


@dataclass
class Loss:
    """A level's sampled chunks (grid row, col) and the squared error found in them so far."""

    chunks: frozenset[tuple[int, int]]
    peak: float  # the dtype's largest value
    squared: float = 0.0
    values: int = 0
    sampled: int = 0
    _reader: ChunkReader | None = None

    def reader(self, array: zarr.Array) -> ChunkReader:
        """The level's chunks as a store's reader reads them (checked, decoded as declared):
        a tenth of the time of a region read through zarr, which costs 4 ms a chunk."""
        if self._reader is None:
            self._reader = ChunkReader(array, 0, "the level just written")
        return self._reader

    @classmethod
    def sample(cls, array: zarr.Array, size: int = SAMPLE_CHUNKS) -> Loss:
        """Up to `size` chunks of a (c, y, x) array, spread at random over its grid."""
        _, height, width = array.shape
        chunk_h, chunk_w = array.chunks[1:]
        rows, cols = -(-height // chunk_h), -(-width // chunk_w)
        picked = np.random.default_rng(0).choice(rows * cols, min(size, rows * cols), False)
        dtype = np.dtype(array.dtype)
        peak = float(np.iinfo(dtype).max) if dtype.kind in "ui" else 1.0
        return cls(frozenset(divmod(int(i), cols) for i in picked), peak)

    def measure(self, array: zarr.Array, y0: int, x0: int, pixels: np.ndarray) -> None:
        """Compare the sampled chunks inside a block just written at (y0, x0) with the
        block's pixels, (h, w, c), as they were handed to the encoder (blocks are whole
        chunks: each chunk is in one block)."""
        chunk_h, chunk_w = array.chunks[1:]
        height, width = pixels.shape[:2]
        for row in range(y0 // chunk_h, -(-(y0 + height) // chunk_h)):
            for col in range(x0 // chunk_w, -(-(x0 + width) // chunk_w)):
                if (row, col) not in self.chunks:
                    continue
                cy0, cx0 = row * chunk_h, col * chunk_w
                cy1, cx1 = min(cy0 + chunk_h, y0 + height), min(cx0 + chunk_w, x0 + width)
                written = self.reader(array).read(cy0, cy1, cx0, cx1).astype(np.float64)
                given = pixels[cy0 - y0 : cy1 - y0, cx0 - x0 : cx1 - x0].astype(np.float64)
                self.squared += float(np.square(written - given).sum())
                self.values += given.size
                self.sampled += 1

    @property
    def psnr(self) -> float | None:
        """PSNR in dB of the chunks sampled; None where none was, or they came back exact."""
        if not self.values or not self.squared:
            return None
        return round(10 * math.log10(self.peak**2 * self.values / self.squared), 2)
