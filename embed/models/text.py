"""Text towers for zero-shot classification: the text half of an image-text checkpoint, its
tokenizer, and how the image features stored beside it meet the text (`TextTower`).

Each is built from the same checkpoint as the image features (the spec's `text` names the
kind, `tilestore.embed.models.spec.TEXT_TOWERS`), offline: files in the Hugging Face cache
or a local folder, tensors read safely (`tilestore.embed.models.hub.load_weights`), no
remote code.

- ``clip``: transformers' CLIPModel (PLIP): ``get_text_features``; the stored image
  features are CLIP's projected embedding already.
- ``siglip``: transformers' SiglipModel (MedSigLIP): ``get_text_features`` of text padded
  to its 64 tokens, as its processor pads it; logits carry SigLIP's bias.
- ``conch``: CONCH v1's CoCa text transformer (`tilestore.embed.models.zoo.ConchText`), its
  byte-level BPE tokenizer (not on the Hub: from the ``conch`` package or a file given);
  the stored features are the pooled embedding before the contrastive projection, which is
  applied here, as CONCH's MI-Zero code (``visual.forward_project``) applies it to them.
- ``open_clip``: open_clip's model of the same architecture (QuiltNet; OmiCLIP's CoCa, its
  text decoder built and loaded too, as open_clip's create_model does), its tokenizer; where
  its text tower is a Hugging Face model (BiomedCLIP's PubMedBERT), open_clip's
  CustomTextCLIP built as open_clip builds it for a checkpoint: the BERT from the config of
  the repo its open_clip_config.json names (cached by `tilestore models pull`, read from
  the cache's folder, never a download at build), its weights from the checkpoint, that
  repo's tokenizer through open_clip's HFTokenizer (text padded to its 256 tokens).
- ``keep``: KEEP's BERT, transformers' BertModel built from its config.json's
  ``text_config`` (what the authors' ``KEEPModel`` builds; no remote code), its pooled output
  (``encode_text``), text padded to 256 tokens as their ``zero_shot_classifier`` pads it, its
  WordPiece vocabulary lower-cased as their loader asks; the stored image features are
  KEEP's projected, unit embedding already.
- ``musk``: MUSK's language experts (`tilestore.embed.models.musk.MuskText`), its XLM-R
  SentencePiece tokenizer (not on the Hub: from the ``musk`` package or a file given), 100
  tokens padded as their ``xlm_tokenizer`` pads them; the stored image features are the
  multiscale 2,048, whose first 1,024 (the tile's class token) go through ``vision_head``
  here, as their zero-shot runs the image (``with_head=True``, ``ms_aug`` off); scored as
  their zero-shot benchmark scores (class means not made unit, logits x 100).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from tilestore.embed.models import hub
from tilestore.embed.models.spec import TOKENIZER_FILE, TOKENIZER_IN_REPO, ModelSpec
from tilestore.embed.models.tokenizers import conch_tokenizer_file, packaged_file, vocabulary
from tilestore.errors import ModelError, OptionError

CONCH_TOKENS = 127  # CONCH's context (128) less the class token it appends
KEEP_TOKENS = 256  # KEEP's text length (their zero_shot_classifier's max_length, padded to it)
MUSK_ZERO_SHOT_SCALE = 100.0  # the logits' scale of MUSK's zero-shot benchmark


@dataclass
class TextTower:
    """A checkpoint's text encoder and the constants its zero-shot logits take.

    encode: texts -> (n, d) text embeddings (unnormalised); logit_scale: the checkpoint's
    temperature, exponentiated; logit_bias: SigLIP's (0 elsewhere); head: what turns the
    stored image features into the joint space where they are stored before it (CONCH's
    contrastive projection), None where they are stored in it; checkpoint: the file it was
    read from, the one the image features must have been made from too; stored_joint: the
    projection (`ModelSpec.projection`) stored features record where they are in the joint
    space. unit_classes: whether a class's embedding, the mean of its prompts' unit
    embeddings, is made unit again (CONCH's `zero_shot_classifier`, open_clip's; MUSK's
    benchmark leaves it as it is)."""

    spec: ModelSpec
    encode: Callable[[list[str]], torch.Tensor]
    logit_scale: float
    logit_bias: float
    head: Callable[[torch.Tensor], torch.Tensor] | None
    checkpoint: hub.Checkpoint
    stored_joint: str | None
    unit_classes: bool = True

    @property
    def revision(self) -> str | None:
        return self.checkpoint.revision

    @property
    def weights(self) -> str:
        return str(self.checkpoint.weights)

    @property
    def weights_sha256(self) -> str:
        """Which weights it was read from (`hub.weights_sha256`), as image features record
        theirs (`LoadedModel.describe`)."""
        return self.checkpoint.sha256

    def embed(self, texts: list[str]) -> torch.Tensor:
        """(n, d) unit text embeddings."""
        with torch.inference_mode():
            return F.normalize(self.encode(list(texts)).float(), dim=-1)

    def joint(self, features: torch.Tensor, projected: bool) -> torch.Tensor:
        """Stored image features as unit vectors of the joint space: through `head` where
        they were stored before it (`projected` False)."""
        with torch.inference_mode():
            features = features.float()
            if not projected:
                if self.head is None:
                    raise ModelError(f"{self.spec.name}: no projection into the text's space")
                features = self.head(features)
            return F.normalize(features, dim=-1)


def refuse_unread_tokenizer(spec: ModelSpec, tokenizer: str | os.PathLike | None) -> None:
    """OptionError where a tokenizer file is given for a text tower that would not read it
    (its tokenizer comes with its checkpoint): said before any store is read."""
    if tokenizer is not None and spec.text not in TOKENIZER_FILE:
        raise OptionError(
            f"tokenizer={str(tokenizer)!r}: {spec.name}'s tokenizer comes with its checkpoint; "
            f"a tokenizer file is read only by the {', '.join(sorted(TOKENIZER_FILE))} text towers"
        )


def load_text_tower(
    spec: ModelSpec,
    *,
    weights: str | os.PathLike | None = None,
    tokenizer: str | os.PathLike | None = None,
    token: str | None = None,
    device: torch.device | str = "cpu",
) -> TextTower:
    """The text tower of `spec`'s checkpoint: from the folder `weights` (the authors' layout,
    as `tilestore models pull` caches it), else the Hub's cache (downloaded where online).
    tokenizer: a tokenizer file where the checkpoint has none (CONCH's, MUSK's); refused for
    the others, whose tokenizer comes with their checkpoint."""
    if spec.text is None:
        raise ModelError(f"{spec.name}: has no text tower; zero-shot takes {_zero_shot_names()}")
    refuse_unread_tokenizer(spec, tokenizer)
    if weights is not None:
        checkpoint = hub.local(spec.name, weights, spec)
    else:
        checkpoint = hub.fetch_spec(spec, token=token)
        if spec.text in TOKENIZER_IN_REPO:
            hub.fetch_tokenizer(spec, token=token)
    tower = TOWERS[spec.text](spec, checkpoint, torch.device(device), tokenizer)
    return tower


def _zero_shot_names() -> str:
    from tilestore.embed.models.registry import list_models

    return ", ".join(s.name for s in list_models() if s.text)


def _transformers(spec: ModelSpec, class_name: str, folder: Path):
    try:
        import transformers
    except ImportError as exc:
        raise ModelError(f"{spec.name}: needs transformers: pip install 'tilestore[hf]'") from exc
    vocabulary(spec, folder)
    try:
        model = getattr(transformers, class_name).from_pretrained(
            folder, local_files_only=True, dtype=torch.float32
        )
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelError(
            f"{spec.name}: cannot load its text tower from {folder} "
            f"({str(exc).splitlines()[0][:200]})"
        ) from exc
    return model.eval(), tokenizer


def _features(output) -> torch.Tensor:
    """transformers' get_*_features: a tensor, or (version 5) an output with the pooled one."""
    return getattr(output, "pooler_output", output)


def _load_strictly(spec: ModelSpec, model: torch.nn.Module, state: dict, assign=False) -> None:
    """The text tower's tensors into `model`, every one used and none missing; ModelError,
    one line naming the first keys (or the tensor of another shape) otherwise."""
    try:
        result = model.load_state_dict(state, strict=False, assign=assign)
    except RuntimeError as exc:  # a tensor of another shape
        lines = str(exc).splitlines()
        first = next((line.strip() for line in lines if "size mismatch" in line), lines[0])
        raise ModelError(f"{spec.name}: the text tower's weights do not fit ({first})") from exc
    if result.missing_keys or result.unexpected_keys:
        raise ModelError(
            f"{spec.name}: the text tower's weights do not fit: missing "
            f"{result.missing_keys[:3]}, unexpected {result.unexpected_keys[:3]}"
        )


def _clip(spec, checkpoint, device, tokenizer_file) -> TextTower:
    model, tokenizer = _transformers(spec, "CLIPModel", checkpoint.weights.parent)
    model = model.to(device)
    length = model.config.text_config.max_position_embeddings

    def encode(texts: list[str]) -> torch.Tensor:
        ids = tokenizer(texts, padding=True, truncation=True, max_length=length,
                        return_tensors="pt").to(device)  # fmt: skip
        return _features(model.get_text_features(**ids))

    scale = float(model.logit_scale.exp())
    return TextTower(spec, encode, scale, 0.0, None, checkpoint, "clip")


def _siglip(spec, checkpoint, device, tokenizer_file) -> TextTower:
    model, tokenizer = _transformers(spec, "SiglipModel", checkpoint.weights.parent)
    model = model.to(device)
    length = model.config.text_config.max_position_embeddings

    def encode(texts: list[str]) -> torch.Tensor:
        # SigLIP pools its last position: text is padded to the full context, as trained
        ids = tokenizer(texts, padding="max_length", truncation=True, max_length=length,
                        return_tensors="pt").to(device)  # fmt: skip
        return _features(model.get_text_features(input_ids=ids["input_ids"]))

    scale, bias = float(model.logit_scale.exp()), float(model.logit_bias)
    return TextTower(spec, encode, scale, bias, None, checkpoint, None)


def _conch(spec, checkpoint, device, tokenizer_file) -> TextTower:
    from transformers import PreTrainedTokenizerFast

    from tilestore.embed.models.zoo import ConchText

    state = hub.load_weights(spec.name, checkpoint.weights, device)
    text = {k.removeprefix("text."): v for k, v in state.items() if k.startswith("text.")}
    missing = [k for k in ("visual.proj_contrast", "logit_scale") if k not in state]
    if missing or not text:
        raise ModelError(
            f"{spec.name}: {checkpoint.weights} holds no text tower "
            f"({', '.join(missing) or 'text.*'} missing): zero-shot needs the whole CoCa "
            "checkpoint (pytorch_model.bin)"
        )
    with torch.device("meta"):
        model = ConchText()
    _load_strictly(spec, model, text, assign=True)
    model.attn_mask = torch.full_like(model.attn_mask, float("-inf"), device=device).triu_(1)
    model = model.eval()
    path = conch_tokenizer_file(checkpoint.weights.parent, tokenizer_file)
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(path), bos_token="<start_of_text>",
                                        eos_token="<end_of_text>", pad_token="<pad>")  # fmt: skip
    projection = state["visual.proj_contrast"].float()

    def encode(texts: list[str]) -> torch.Tensor:
        # CONCH's tokenize: 127 ids padded to the full length (its placeholder for the
        # class token, which encode_text drops again, is not added)
        ids = tokenizer(texts, max_length=CONCH_TOKENS, add_special_tokens=True,
                        return_token_type_ids=False, truncation=True, padding="max_length",
                        return_tensors="pt")["input_ids"]  # fmt: skip
        return model(ids.to(device))

    scale = float(state["logit_scale"].float().exp())
    return TextTower(spec, encode, scale, 0.0, lambda f: f @ projection.to(f.device),
                     checkpoint, "contrast")  # fmt: skip


def _open_clip(spec, checkpoint, device, tokenizer_file) -> TextTower:
    import open_clip

    from tilestore.embed.models.families import is_coca, open_clip_config, open_clip_state

    config = open_clip_config(spec, checkpoint.config)
    text = config.get("text_cfg", {})
    if text.get("hf_model_name"):
        model, tokenizer = _open_clip_hf(spec, config, device)
    else:
        # a CoCa (OmiCLIP) as open_clip's create_model builds it: its flag for the class off
        kind, arguments = (
            (open_clip.coca_model.CoCa, {k: v for k, v in config.items() if k != "custom_text"})
            if is_coca(config)
            else (open_clip.model.CLIP, config)
        )
        with device:
            model = kind(**arguments).eval()
        # open_clip's own tokenizer (its BPE vocabulary ships in the package)
        tokenizer = open_clip.tokenizer.SimpleTokenizer(
            context_length=text.get("context_length", 77)
        )
    state = open_clip_state(hub.load_weights(spec.name, checkpoint.weights, device))
    # a buffer transformers saved before 4.31 and computes itself since (open_clip drops it)
    state.pop("text.transformer.embeddings.position_ids", None)
    _load_strictly(spec, model, state)
    model = model.eval()

    def encode(texts: list[str]) -> torch.Tensor:
        return model.encode_text(tokenizer(texts).to(device))

    scale = float(model.logit_scale.detach().exp())
    return TextTower(spec, encode, scale, 0.0, None, checkpoint, None)


def _open_clip_hf(spec: ModelSpec, config: dict, device: torch.device):
    """open_clip's CustomTextCLIP whose text tower is a Hugging Face model, and its tokenizer,
    as open_clip's create_model and get_tokenizer make them for a checkpoint (the BERT built
    from its config alone: its weights are the checkpoint's), each repo read from the
    folder the cache holds it in."""
    import open_clip

    from tilestore.embed.models.families import open_clip_text_repos

    text = config["text_cfg"]
    folders = {r: hub.fetch_text_model(spec.name, r) for r in open_clip_text_repos(config)}
    built = {**config, "text_cfg": {**text, "hf_model_name": str(folders[text["hf_model_name"]]),
                                    "hf_model_pretrained": False}}  # fmt: skip
    built.pop("custom_text", None)  # open_clip's flag for this class, not an argument of it
    length = text.get("context_length", 77)
    try:
        with device:
            model = open_clip.model.CustomTextCLIP(**built)
        if not text.get("hf_tokenizer_name"):  # open_clip's choice, where none is named
            return model, open_clip.tokenizer.SimpleTokenizer(context_length=length)
        folder = folders[text["hf_tokenizer_name"]]
        vocabulary(spec, folder)
        tokenizer = open_clip.tokenizer.HFTokenizer(
            str(folder), context_length=length, tokenizer_mode=text.get("tokenizer_mode"),
            **text.get("tokenizer_kwargs", {}),
        )  # fmt: skip
    except (OSError, ValueError) as exc:
        raise ModelError(
            f"{spec.name}: cannot build its text tower from {', '.join(map(str, folders.values()))}"
            f" ({str(exc).splitlines()[0][:200]})"
        ) from exc
    return model, tokenizer


def _keep(spec, checkpoint, device, tokenizer_file) -> TextTower:
    import transformers

    folder = checkpoint.weights.parent
    settings = (checkpoint.config or {}).get("text_config")
    if not isinstance(settings, dict):
        raise ModelError(
            f"{spec.name}: no config.json with a text_config beside its weights in {folder}: "
            f"`tilestore models pull {spec.name}` fetches it, or copy the repo's there"
        )
    state = hub.load_weights(spec.name, checkpoint.weights, device)
    # position ids: a buffer older transformers saved, computed by BertModel itself
    text = {k.removeprefix("text."): v for k, v in state.items()
            if k.startswith("text.") and not k.endswith("position_ids")}  # fmt: skip
    if not text or "logit_scale" not in state:
        raise ModelError(
            f"{spec.name}: {checkpoint.weights} holds no text tower ({'text.*' if not text else ''}"
            f"{' logit_scale' if 'logit_scale' not in state else ''} missing): zero-shot needs "
            "the whole KEEP checkpoint (model.safetensors)"
        )
    with device:
        model = transformers.BertModel(transformers.BertConfig(**settings))
    _load_strictly(spec, model, text)
    model = model.eval()
    vocabulary(spec, folder)
    try:
        tokenizer = transformers.BertTokenizerFast.from_pretrained(
            folder, local_files_only=True, do_lower_case=True
        )
    except (OSError, ValueError) as exc:
        raise ModelError(
            f"{spec.name}: cannot load its tokenizer from {folder} "
            f"({str(exc).splitlines()[0][:200]})"
        ) from exc

    def encode(texts: list[str]) -> torch.Tensor:
        ids = tokenizer(texts, max_length=KEEP_TOKENS, padding="max_length", truncation=True,
                        return_tensors="pt").to(device)  # fmt: skip
        return model(**ids).pooler_output

    scale = float(state["logit_scale"].float().exp())
    return TextTower(spec, encode, scale, 0.0, None, checkpoint, "keep")


def _musk(spec, checkpoint, device, tokenizer_file) -> TextTower:
    from tilestore.embed.models import musk

    state = hub.load_weights(spec.name, checkpoint.weights, device)
    missing = [k for k in ("vision_head.weight", "language_head.weight",
                           "beit3.text_embed.weight") if k not in state]  # fmt: skip
    if missing:
        raise ModelError(
            f"{spec.name}: {checkpoint.weights} holds no text tower ({', '.join(missing)} "
            "missing): zero-shot needs the whole MUSK checkpoint (model.safetensors)"
        )
    text = musk.musk_text_state(state)
    # the sizes the checkpoint holds; heads of BEiT-3's width (64: MUSK-large's 1024 / 16)
    vocab, dim = text["embed.weight"].shape
    depth = len({k.split(".")[1] for k in text if k.startswith("blocks.")})
    with torch.device("meta"):
        positions = text["pos_embed"].shape[1] + musk.POSITION_OFFSET
        model = musk.MuskText(depth, dim, max(1, dim // musk.HEAD_WIDTH), vocab, positions)
    _load_strictly(spec, model, text, assign=True)
    model = model.eval()
    path = packaged_file(
        spec.name, checkpoint.weights.parent, tokenizer_file, (musk.TOKENIZER,), "musk",
        f"models/{musk.TOKENIZER}", f"github.com/lilab-stanford/MUSK, musk/models/{musk.TOKENIZER}",
    )  # fmt: skip
    try:
        tokenizer = musk.XlmTokenizer(path)
    except ImportError as exc:
        needs = f"{spec.name}: needs sentencepiece: pip install 'tilestore[musk]'"
        raise ModelError(needs) from exc
    except (OSError, RuntimeError) as exc:  # not a SentencePiece model
        raise ModelError(f"{spec.name}: cannot read its tokenizer {path} ({exc})") from exc
    image_head = state["vision_head.weight"].float()
    width = image_head.shape[1]
    stored = width * len(spec.arch.kwargs.get("scales", (1,)))  # a class token per scale

    def encode(texts: list[str]) -> torch.Tensor:
        ids, padding = tokenizer(texts, musk.TEXT_TOKENS)
        return model(ids.to(device), padding.to(device))

    def head(features: torch.Tensor) -> torch.Tensor:
        # the stored features: the tile's class token, then the larger scale's (ms_aug);
        # zero-shot reads the first (ms_aug off, as their README runs it)
        if features.shape[1] != stored:
            raise RuntimeError(f"{features.shape[1]}-d features, these weights' are {stored}")
        return features[:, :width] @ image_head.to(features.device).T

    # their zero-shot benchmark (benchmarks/clip_benchmark/metrics/zeroshot_classification.py):
    # logits 100 x the image's unit embedding . the class's, the mean of its prompts' unit
    # embeddings not made unit again (the line that would is commented out for MUSK alone);
    # the checkpoint's own temperature is not what they score with
    return TextTower(spec, encode, MUSK_ZERO_SHOT_SCALE, 0.0, head, checkpoint, "vision_head",
                     unit_classes=False)  # fmt: skip


# a spec's `text` -> (spec, checkpoint, device, tokenizer file) -> its text tower
TOWERS: dict[str, Callable[..., TextTower]] = {
    "clip": _clip,
    "siglip": _siglip,
    "conch": _conch,
    "open_clip": _open_clip,
    "keep": _keep,
    "musk": _musk,
}
