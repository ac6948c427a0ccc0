"""Zero-shot classification of stored tiles: an image-text model's text tower embeds the
classes' prompts, and each tile's stored features are scored against them (`classify`).

Per tile, as the authors' code scores an image (CONCH's ``zero_shot_classifier`` and
MI-Zero; CLIP's and SigLIP's logits): the class embedding is the mean of its prompts' unit
text embeddings, made unit; the tile's stored features are taken into the joint space where
they are stored before it (CONCH v1's contrastive projection, ``visual.forward_project``)
and made unit; logits are ``logit_scale * cosine (+ SigLIP's logit_bias)``, the checkpoint's
own constants; the probabilities their softmax over the classes. Per slide: the mean of its
tiles' probabilities (MI-Zero's top-K pooling of tile logits is the CONCH authors' slide
rule for their benchmarks; the mean is what a heatmap's tiles add up to, and is recorded as
the rule used).

The features are used exactly as stored: a group whose pooling is not the image embedding
the text tower was trained against, made with random weights, or not recorded as made from
the very weights file the text tower is read from (the sha256 of its bytes, which
`LoadedModel.describe` records with the features), is refused in one line rather than
scored.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from tilestore.embed.prompts import Prompts, read_prompts
from tilestore.embed.settings import Device
from tilestore.embeddings.recipe import ScaleLabel
from tilestore.errors import EmbeddingError, ModelError, OtherWeights
from tilestore.options import Declared, Opt

ROWS = 2**16  # tiles scored at a time (their features in fp32: 512-d, 128 MB)
SLIDE_RULE = "mean of the tile probabilities"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True)
class ZeroShotOptions(Declared):
    """How to classify stored tiles, each option declared once here (`tilestore.options`)."""

    name: Annotated[
        str | None,
        Opt(
            "The score set's name in the store (its columns: NAME:<class>, and NAME, the most "
            "probable class); a set of that name is replaced.",
            pattern=r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}",
            shape="letters, digits, _ - . (at most 64)",
            none="the prompts file's name",
        ),
    ] = None
    weights: Annotated[
        Path | None,
        Opt(
            "A folder holding the model's checkpoint in its authors' layout (the text tower "
            "is read from it).",
            none="the Hugging Face cache",
        ),
    ] = None
    tokenizer: Annotated[
        Path | None,
        Opt(
            "The tokenizer file where the checkpoint has none (CONCH v1's "
            "conch_byte_level_bpe_uncased.json, MUSK's tokenizer.spm).",
            none="beside the weights, or an installed conch or musk package's",
        ),
    ] = None
    device: Device = "auto"
    hf_token: Annotated[
        str | None, Opt("Hugging Face token.", none="HF_TOKEN or the stored login")
    ] = None
    scale: ScaleLabel = None


@dataclass(frozen=True)
class Classified:
    """One store's scores: where they were written and the slide's score per class."""

    store: str
    path: str
    tiles: int
    classes: tuple[str, ...]
    slide: dict[str, float]

    @property
    def top(self) -> str:
        return max(self.slide, key=self.slide.get)


def classify(
    stores: list[str | os.PathLike],
    model: str,
    prompts: str | os.PathLike | Prompts,
    options: ZeroShotOptions = ZeroShotOptions(),
) -> list[Classified]:
    """Score every stored tile of `model` in each store against the classes of `prompts`
    (a file, `tilestore.embed.prompts`), write the probabilities beside the features
    (`tilestore.embeddings.scores`: columns the viewer shows as heatmaps) and return each
    store's slide score. The prompts and the model are checked before anything loads, and
    the stores' features are one population (`tilestore.embeddings.recipe.combine`: made
    alike, at one scale or the `options.scale` kept), so the slide scores returned side by
    side are of features that may meet."""
    from tilestore.embed.models import get_model

    prompts = prompts if isinstance(prompts, Prompts) else read_prompts(prompts)
    spec = get_model(model)
    if spec.text is None:
        from tilestore.embed.models.text import _zero_shot_names

        raise ModelError(f"model={model!r} has no text tower; zero-shot takes {_zero_shot_names()}")
    name = options.name or Path(prompts.path).stem
    if not _NAME.fullmatch(name):
        raise EmbeddingError(f"prompts={prompts.path!r}: name the set with name= ({name!r} is "
                             "not letters, digits, _ - .)")  # fmt: skip
    import torch

    from tilestore.embed.models.text import load_text_tower, refuse_unread_tokenizer
    from tilestore.embed.settings import resolve_device

    refuse_unread_tokenizer(spec, options.tokenizer)
    device, _ = resolve_device(options.device, "fp32")
    # the stores' features one population before the tower loads (a cohort of two scales is
    # refused at once, whole, as a store of other weights is by `_checked` below)
    stores = _one_population(stores, model, options.scale)
    tower = load_text_tower(spec, weights=options.weights, tokenizer=options.tokenizer,
                            token=options.hf_token, device=device)  # fmt: skip
    classes = class_embeddings(tower, prompts)
    # every store's features checked (their metadata and width) before any store's scores
    # are written: a cohort with one store embedded otherwise is refused whole, not half done
    checked = [(str(s), _checked(str(s), model, tower, classes, torch)) for s in stores]
    return [
        _one(store, model, name, prompts, tower, classes, projected, torch)
        for store, projected in checked
    ]


def _one_population(
    stores: list[str | os.PathLike], model: str, scale: str | None
) -> list[str | os.PathLike]:
    """The stores whose features may meet (`combine`): MixedResults where their recipes or
    scales differ, unless `scale` names the one to keep (the others left out, a warning)."""
    from tilestore.embeddings.groups import open_finished
    from tilestore.embeddings.recipe import combine, recipe

    found = [(str(s), recipe(open_finished(str(s), model).meta)) for s in stores]
    return [stores[i] for i in combine(found, f"{model!r} embeddings", scale)]


def _checked(store: str, model: str, tower, classes, torch) -> bool:
    """`_refusal` from the group's metadata, and its features' width against what the text
    tower's joint space takes (one probe row through the tower's head where it projects),
    without reading the features: whether they are in the joint space already."""
    from tilestore.embeddings.groups import open_finished

    found = open_finished(store, model)
    projected = _refusal(store, model, dict(found.meta.get("model") or {}), tower)
    width = found.arrays["features"].shape[1]
    wrong = f"{store}: {model}'s stored features are {width}-d"
    if projected or tower.head is None:
        if width != classes.shape[1]:
            raise EmbeddingError(f"{wrong}, its text embeddings {classes.shape[1]}-d; "
                                 f"embed the store again with {model}")  # fmt: skip
        return projected
    probe = torch.zeros(1, width, device=classes.device)
    try:
        tower.joint(probe, projected)
    except RuntimeError as exc:  # a head of another width (torch's own message is pages)
        raise EmbeddingError(f"{wrong}, not what {model}'s projection takes; embed the "
                             f"store again with {model}") from exc  # fmt: skip
    return projected


def class_embeddings(tower, prompts: Prompts):
    """(classes, d) class embeddings: each the mean of its prompts' unit embeddings, made
    unit where the tower's authors do (CONCH's prompt ensembling over names and templates;
    MUSK's benchmark keeps the mean: `TextTower.unit_classes`)."""
    import torch
    import torch.nn.functional as F

    rows = torch.stack([tower.embed(prompts.texts(c)).mean(dim=0) for c in prompts.names])
    return F.normalize(rows, dim=-1) if tower.unit_classes else rows


def tile_probabilities(tower, classes, features, projected: bool):
    """(tiles, classes) softmax probabilities of stored `features` (a tensor) and the
    logits they come from."""
    import torch

    joint = tower.joint(features, projected)
    logits = tower.logit_scale * joint @ classes.T + tower.logit_bias
    return torch.softmax(logits, dim=-1), logits


def _one(store, model, name, prompts, tower, classes, projected, torch) -> Classified:
    """One store checked already (`_checked`): its probabilities computed and written."""
    from tilestore.embeddings.scores import write_tile_scores
    from tilestore.embeddings.slides import read_tile_features

    tiles = read_tile_features(store, model)
    device = classes.device
    parts = []
    for start in range(0, tiles.tiles, ROWS):
        block = torch.from_numpy(tiles.features[start : start + ROWS]).to(device)
        parts.append(tile_probabilities(tower, classes, block, projected)[0].cpu())
    probabilities = torch.cat(parts).numpy()
    slide = dict(zip(prompts.names, probabilities.mean(axis=0).astype(float).tolist(), strict=True))
    record: dict[str, Any] = {
        "classes": prompts.names,
        "prompts": {"file": prompts.path, "classnames": {k: list(v) for k, v in
                    prompts.classes.items()}, "templates": list(prompts.templates)},
        "text_tower": tower.spec.text,
        "weights": tower.weights,
        "revision": tower.revision,
        "weights_sha256": tower.weights_sha256,
        "logit_scale": tower.logit_scale,
        "logit_bias": tower.logit_bias,
        "class_embedding": "mean of the prompts' unit embeddings"
        + (", made unit" if tower.unit_classes else ""),
        "projected_here": not projected,
        "slide": slide,
        "slide_rule": SLIDE_RULE,
    }  # fmt: skip
    source = {**tiles.source(), "finished": tiles.finished}
    path = write_tile_scores(store, tiles.path, name, probabilities, record, source)
    return Classified(store, path, tiles.tiles, tuple(prompts.names), slide)


def _refusal(store: str, model: str, stored: dict[str, Any], tower) -> bool:
    """Whether the stored features are in the joint space already (else the tower's head
    takes them there); EmbeddingError, one line, where they are not what its zero-shot
    reads."""
    spec = tower.spec
    pooling, projection = stored.get("pooling"), stored.get("projection")
    fix = f"embed the store again with model={model!r} (overwrite=True)"
    if pooling != spec.pooling:
        raise EmbeddingError(
            f"{store}: {model}'s features are pooled {pooling!r}; its zero-shot reads the "
            f"image embedding ({spec.pooling!r} pooling); {fix}"
        )
    if stored.get("weights") == "random" or stored.get("source") == "random":
        raise EmbeddingError(f"{store}: {model}'s features were made with random weights; {fix}")
    _same_weights(store, model, stored.get("weights_sha256"), tower, fix)
    if projection == tower.stored_joint:
        return True
    if projection is None and tower.head is not None:
        return False
    raise EmbeddingError(
        f"{store}: {model}'s features are stored with projection {projection!r}, its zero-shot "
        f"reads them with {tower.stored_joint!r}; {fix}"
    )


def _same_weights(store: str, model: str, made: str | None, tower, fix: str) -> None:
    """OtherWeights, one line, unless the features record the sha256 of the weights file the
    text tower was read from: a revision or a path says nothing of a file given or copied,
    and a text tower of other weights scores the features without any error."""
    now = tower.weights_sha256
    if made is None:
        raise OtherWeights(
            f"{store}: {model}'s features do not record which weights made them (no "
            f"weights_sha256: embedded before it was recorded, or elsewhere), so they cannot "
            f"be matched to the text tower's ({tower.weights}, sha256 {now}); {fix}, with the "
            "checkpoint the text tower is read from"
        )
    if made != now:
        raise OtherWeights(
            f"{store}: {model}'s features were made with weights of sha256 {made}, its text "
            f"tower is read from {tower.weights}, sha256 {now}: the two halves of one "
            f"checkpoint are needed; {fix} from that checkpoint, or read the text tower "
            "from the weights the features were made with (weights=<folder>)"
        )
