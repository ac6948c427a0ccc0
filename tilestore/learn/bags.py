"""Bags of tile features for training: a cohort's features read from the stores once.

`load_bags` reads every slide's stored tile features (`tilestore.embeddings.groups
.open_finished`) into ONE tensor (tiles, D) on the device, with each slide's offsets and
tile coordinates; a patient's bag joins its slides. Where the features do not fit the
device (`memory`: the bytes it may take), they stay in the stores and each batch is read
from them as it is asked for (`Bags.streamed`), so a cohort too big for the GPU trains
slower instead of failing. `Bags.from_arrays` makes bags of arrays already in memory (the
scale bench, the planted-region check): the same API either way. A cohort of a slide
encoder's vectors reads one row per slide instead (`Source`): a patient's bag is its
slides' vectors, which the vector models average.

>>> bags = load_bags(cohort, device="cuda", dtype="bfloat16")
>>> x, mask = bags.batch([0, 3, 7])      # (3, longest bag, D), (3, longest bag) True = tile
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from tilestore.errors import OptionError

DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class Bags:
    """Patients' bags of tile features.

    features: (tiles, D) torch tensor on the device (None: `read` gives each slide's
    features, streamed); offsets: (slides + 1,) the slides' rows in `features`; coords:
    (tiles, 2) each tile's x, y (level-0 px); slide_names: the slides in order; members:
    each patient's slide indices (patients in the cohort's order)."""

    features: Any
    offsets: np.ndarray
    coords: np.ndarray
    slide_names: tuple[str, ...]
    members: tuple[tuple[int, ...], ...]
    dim: int
    device: str
    dtype: str
    read: Callable[[int], np.ndarray] | None = None  # streamed: slide index -> (tiles, D)

    @property
    def streamed(self) -> bool:
        return self.features is None

    @property
    def patients(self) -> int:
        return len(self.members)

    def tiles(self, patient: int) -> int:
        return int(sum(self.offsets[s + 1] - self.offsets[s] for s in self.members[patient]))

    def slide(self, index: int) -> Any:
        """One slide's features (tiles, D) on the device."""
        import torch

        if self.features is not None:
            return self.features[int(self.offsets[index]) : int(self.offsets[index + 1])]
        values = torch.from_numpy(np.ascontiguousarray(self.read(index), dtype=np.float32))
        return values.to(device=self.device, dtype=getattr(torch, self.dtype))

    def bag(self, patient: int) -> Any:
        """A patient's bag: its slides' tiles joined (tiles, D)."""
        import torch

        parts = [self.slide(s) for s in self.members[patient]]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def batch(self, patients: Sequence[int]) -> tuple[Any, Any]:
        """Bags of `patients` padded to the longest: x (B, N, D) and mask (B, N), True on
        real tiles (None for one bag: nothing padded)."""
        import torch

        bags = [self.bag(p) for p in patients]
        if len(bags) == 1:
            return bags[0].unsqueeze(0), None
        longest = max(len(b) for b in bags)
        x = bags[0].new_zeros((len(bags), longest, self.dim))
        mask = torch.zeros((len(bags), longest), dtype=torch.bool, device=x.device)
        for i, b in enumerate(bags):
            x[i, : len(b)] = b
            mask[i, : len(b)] = True
        return x, mask

    @classmethod
    def from_arrays(
        cls,
        slides: Sequence[np.ndarray],
        members: Sequence[Sequence[int]],
        *,
        names: Sequence[str] | None = None,
        coords: Sequence[np.ndarray] | None = None,
        device: str = "cpu",
        dtype: str = "float32",
        workers: int = 1,
    ) -> Bags:
        """Bags of features already in memory: `slides` each (tiles, D) (numpy or torch, any
        sequence: one is asked for at a time, or read `workers` at a time in threads a few
        ahead: `_in_order`), `members` each patient's slide indices."""
        import torch

        _check_dtype(dtype)
        shapes = [tuple(slides[i].shape) for i in range(len(slides))]
        dims = {int(s[1]) for s in shapes}
        if len(dims) != 1:
            raise OptionError(f"slides of feature widths {sorted(dims)}: one width only")
        offsets = np.concatenate([[0], np.cumsum([s[0] for s in shapes])]).astype(np.int64)
        target = getattr(torch, dtype)
        features = torch.empty((int(offsets[-1]), dims.pop()), dtype=target, device=device)
        # a few slides at a time: never a second copy of the cohort in memory
        for i, part in enumerate(_in_order(slides, workers)):
            features[int(offsets[i]) : int(offsets[i + 1])] = part.to(device=device, dtype=target)
        xy = (
            np.concatenate(list(coords))
            if coords is not None
            else np.zeros((int(offsets[-1]), 2), np.int64)
        )
        return cls(
            features,
            offsets,
            xy,
            tuple(names or (f"slide{i}" for i in range(len(slides)))),
            tuple(tuple(int(i) for i in m) for m in members),
            int(features.shape[1]),
            str(device),
            dtype,
        )


def _values(slide: Any) -> Any:
    """A slide's features as a torch tensor (read where stored)."""
    import torch

    return slide if isinstance(slide, torch.Tensor) else torch.as_tensor(np.asarray(slide))


def _in_order(slides: Sequence[Any], workers: int) -> Iterator[Any]:
    """Each slide's features (`_values`) in order; with `workers` > 1 read in that many
    threads (zarr's decompression leaves the GIL), at most 2 x workers ahead."""
    if workers <= 1:
        yield from (_values(slides[i]) for i in range(len(slides)))
        return
    with ThreadPoolExecutor(workers) as pool:
        ahead: deque = deque()
        for i in range(len(slides)):
            ahead.append(pool.submit(_values, slides[i]))
            if len(ahead) > 2 * workers:
                yield ahead.popleft().result()
        while ahead:
            yield ahead.popleft().result()


def read_workers() -> int:
    """Threads that open and read stores at once: the CPUs, at most 16."""
    return max(1, min(16, os.cpu_count() or 1))


def _check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise OptionError(f"dtype={dtype!r}: choose among {', '.join(DTYPES)}")


def device_room(device: str) -> int:
    """Bytes the features may take on `device`: 80% of the GPU's free memory, or of the
    host's available memory for the CPU."""
    if device.startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(free * 0.8)
    import psutil

    return int(psutil.virtual_memory().available * 0.8)


@dataclass(frozen=True)
class Stored:
    """One store's features as a run reads them: `features` (n, D) (a stored array, read
    when sliced), each row's x, y (level-0 px; 0 for a slide vector), their recipe (what
    `combine` compares) and the finished tile group (None for a slide vector)."""

    features: Any
    coords: np.ndarray
    recipe: Any
    group: Any = None


@dataclass(frozen=True)
class Source:
    """Which features a cohort or a run reads in each store: `model`'s tile features of
    `plan`, or, with `slide_encoder`, that encoder's one vector per slide (a bag of one row;
    a patient's bag joins its slides' vectors). Decided here once for training
    (`load_bags`), the run's record (`features_of`) and new stores (`predict`)."""

    model: str
    plan: str | None = None
    slide_encoder: str | None = None

    def read(self, store: Any) -> Stored:
        """The features of one store (NotEmbedded, StaleSlideEmbedding... where not there)."""
        from tilestore.embeddings.groups import open_finished
        from tilestore.embeddings.recipe import recipe

        if self.slide_encoder is None:
            group = open_finished(store, self.model, self.plan)
            xy = np.stack([group.arrays["x"][:], group.arrays["y"][:]], axis=1)
            return Stored(group.arrays["features"], xy.astype(np.int64), recipe(group.meta), group)
        from tilestore.embeddings.slides import _with_encoder, read_slide_vector

        found = read_slide_vector(store, self.model, self.slide_encoder, self.plan)
        vector = np.asarray(found["vector"], np.float32)[None]
        return Stored(
            vector, np.zeros((1, 2), np.int64), _with_encoder(found["recipe"], found["record"])
        )

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "plan": self.plan, "slide_encoder": self.slide_encoder}


def source_of(cohort: Any) -> Source:
    """The features a cohort holds."""
    return Source(cohort.model, cohort.plan, cohort.slide_encoder)


def load_bags(
    cohort: Any,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    memory: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> Bags:
    """The cohort's features (`source_of`: tile features, or one slide vector per slide) read
    from its stores once, onto `device` as `dtype`; streamed from the stores per batch where
    they need more than `memory` bytes (None: `device_room`)."""
    import torch

    _check_dtype(dtype)
    source = source_of(cohort)
    with ThreadPoolExecutor(read_workers()) as pool:  # opening checks each store's integrity
        found = list(pool.map(source.read, [s.store for s in cohort.slides]))
    counts = [int(f.features.shape[0]) for f in found]
    dims = {int(f.features.shape[1]) for f in found}
    if len(dims) != 1:
        raise OptionError(f"{cohort.model!r} features of widths {sorted(dims)}: one width only")
    dim = dims.pop()
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    coords = np.concatenate([f.coords for f in found]).astype(np.int64)
    index = {s.patient: [] for s in cohort.slides}
    for i, s in enumerate(cohort.slides):
        index[s.patient].append(i)
    members = tuple(tuple(index.get(p, ())) for p in cohort.patients)
    names = tuple(s.slide for s in cohort.slides)
    need = int(offsets[-1]) * dim * torch.empty((), dtype=getattr(torch, dtype)).element_size()
    room = device_room(device) if memory is None else memory
    if need > room:
        if progress:
            progress(
                f"features: {need / 2**30:.1f} GiB > {room / 2**30:.1f} GiB on {device}: "
                "streamed from the stores per batch"
            )
        arrays = [f.features for f in found]
        return Bags(
            None, offsets, coords, names, members, dim, device, dtype, read=lambda i: arrays[i][:]
        )
    bags = Bags.from_arrays(
        _Each([f.features for f in found]),
        members,
        names=names,
        device=device,
        dtype=dtype,
        workers=read_workers(),
    )
    return Bags(bags.features, offsets, coords, names, members, dim, device, dtype)


class _Each:
    """Stored arrays read one at a time as `from_arrays` asks (no list of the whole cohort)."""

    def __init__(self, arrays: list[Any]) -> None:
        self.arrays = arrays

    def __len__(self) -> int:
        return len(self.arrays)

    def __getitem__(self, i: int) -> Any:
        return self.arrays[i] if i < 0 else _Shaped(self.arrays[i])


class _Shaped:
    """A stored array's shape at once, its values when converted (np.asarray)."""

    def __init__(self, array: Any) -> None:
        self.array, self.shape = array, array.shape

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        values = self.array[:]
        return values if dtype is None else values.astype(dtype)


def features_of(cohort: Any) -> dict[str, Any]:
    """What the cohort's features are, as a run records them and `predict` compares: the
    model, the plan, the slide encoder (None: tile features), and one store's recipe
    (`tilestore.embeddings.recipe`: the model's facts, channels, scale); the cohort's stores
    are one recipe (`combine`)."""
    source = source_of(cohort)
    found = source.read(cohort.slides[0].store).recipe
    scale = found.scale
    return {
        **source.to_json(),
        "facts": found.facts,
        "channels": list(found.channels) if found.channels else None,
        "scale": None
        if scale is None
        else {"mpp": scale.mpp, "tile": scale.tile, "stride": scale.stride},
    }


def recipe_of(features: dict[str, Any]) -> Any:
    """The `Recipe` a run recorded (`features_of`), for `combine`."""
    from tilestore.embeddings.recipe import Recipe, Scale

    scale = features.get("scale")
    return Recipe(
        dict(features["facts"]),
        tuple(features["channels"]) if features.get("channels") else None,
        None if scale is None else Scale(scale["mpp"], int(scale["tile"]), int(scale["stride"])),
    )
