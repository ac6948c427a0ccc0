"""Our tile encoders against a reference implementation (GPU machine): same weights, same tiles.

For each registered encoder with a reference that runs offline, one set of random weights is
saved in the layout its authors publish, loaded by the reference and by tilestore, and both
embed the same real H&E tiles (CMU-1-Small-Region) in fp32 with TF32 off. The table gives
the lowest cosine over the tiles and the largest |difference|, for tiles at the model's input
size ("model": the transforms' resize is the identity) and at the size our plan reads for it
("with transform", where that differs).

References, each a local copy, run in a separate process with the versions they pin:
  trident:<name>   TRIDENT's `encoder_factory(name, weights_path=...)` (mahmoodlab/TRIDENT;
                   its loaders of GigaPath and H-optimus assert timm 0.9.16, so that process
                   runs timm 0.9.16), with CONCH v1 from mahmoodlab/CONCH, CTransPath from
                   timm_ctp, OpenMidnight's DINOv2 from facebookresearch/dinov2 (torch.hub
                   pointed at the local copy). H0-mini loads from the Hub only: it is given a
                   local Hugging Face cache, and TRIDENT's internet check is told yes.
  timm-hub         timm's own `create_model("hf-hub:REPO", pretrained=True)` and its
                   transform, from a local Hugging Face cache (how LazySlide loads Lunit's).
  authors          the authors' own code where TRIDENT has none that runs offline: Hibou
                   from HistAI/hibou (`build_model`, DINOv2's layout; TRIDENT loads Hibou-L
                   from the Hub with transformers' remote code), with TRIDENT's transform;
                   MUSK from lilab-stanford/MUSK (`--musk`: its `musk` package and its copy of
                   torchscale; fairscale and einops on the reference's path): their
                   `musk_large_patch16_384`, their `load_model_and_may_interpolate` of the
                   safetensors file, their README's call (ms_aug=True) and transform.
  transformers     `CLIPModel.get_image_features` (PLIP), in this process.
  authors (iSight) the construction of zhihuanglab/iSight's `CLAM_ViT` (transformers'
                   `CLIPModel` from their training checkpoint's `model_state_dict`, its vision
                   tower's `hidden_states[-1]`, `visual_token_projection`, the mean over every
                   token), in this process.
  authors (KEEP)   the construction of MAGIC-AI4Med/KEEP's `KEEPModel` (timm's ViT-L/16 with
                   their arguments, `visual_head`, a BERT), saved as the Hub holds it (layer
                   scales named `weight`), its `encode_image` / `encode_text`, in this process.
GenBio-PathFM's reference is TRIDENT's `genbio-pathfm` (its copy of the authors' code);
PathOrchestra, mSTAR, Digepath and Prost40M are timm `hf-hub:` models (the peers' loaders).

`--precision authors` runs both sides under autocast in each model's registered precision
(fp16, bf16) instead of fp32; `--device cpu` (or BENCH_DEVICE=cpu) runs without a GPU.

TRIDENT's package `__init__` imports its slide readers and its whole pipeline; the reference
process imports only its encoders (`trident.patch_encoder_models`, with `trident.IO` and
the model code they import), its package entry made without running that `__init__`.

    python bench/encoders.py --trident .peers/TRIDENT --conch .peers/CONCH \
        --dinov2 .peers/dinov2 --hibou .peers/hibou --musk .peers/MUSK \
        --reference-path /tmp/refsite:/tmp/site
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

# ours -> (reference, its options); the reference's kwargs choose the pooling ours registers
TRIDENT = {
    "uni": ("uni_v1", {}),
    "uni2-h": ("uni_v2", {}),
    "prov-gigapath": ("gigapath", {}),
    "virchow": ("virchow", {}),
    "virchow2": ("virchow2", {}),
    "virchow2-cls": ("virchow2", {}),
    "h-optimus-0": ("hoptimus0", {}),
    "h-optimus-1": ("hoptimus1", {}),
    "h0-mini": ("h0-mini", {"return_type": "cls+mean"}),
    "kaiko-vits16": ("kaiko-vits16", {}),
    "kaiko-vits8": ("kaiko-vits8", {}),
    "kaiko-vitb16": ("kaiko-vitb16", {}),
    "kaiko-vitb8": ("kaiko-vitb8", {}),
    "kaiko-vitl14": ("kaiko-vitl14", {}),
    "lunit-vits8": ("lunit-vits8", {}),
    "gpfm": ("gpfm", {}),
    "openmidnight": ("openmidnight", {}),
    "midnight": ("midnight12k", {"return_type": "cls+mean"}),
    "phikon": ("phikon", {}),
    "phikon-v2": ("phikon_v2", {}),
    "chief-ctranspath": ("ctranspath", {}),
    "conch-v1": ("conch_v1", {}),
    "conch-v1.5": ("conch_v15", {}),
    "genbio-pathfm": ("genbio-pathfm", {}),
}
TIMM_HUB = ("lunit-vits16", "lunit-bt", "lunit-mocov2", "lunit-swav", "pathorchestra", "mstar",
            "digepath", "prost40m", "reddino-small", "reddino-base", "reddino-large")  # fmt: skip
# TRIDENT loads these from the Hub (H0-mini: only from there; Lunit: its local-checkpoint
# path takes timm's ImageNet defaults instead of the port's config): a local cache stands in
HUB_CACHE = ("h0-mini", "lunit-vits8")
OTHER = {
    "plip": "transformers CLIPModel.get_image_features",
    "isight": "authors: CLIPModel hidden_states[-1] + visual_token_projection, token mean",
    "medsiglip": "transformers SiglipModel.get_image_features",
    "quiltnet-b32": "open_clip create_model(pretrained=FILE).encode_image",
    "quiltnet-b16": "open_clip create_model(pretrained=FILE).encode_image",
    "biomedclip": "open_clip create_model_and_transforms(hf-hub:...).encode_image",
    "omiclip": "authors (Loki load_model): open_clip create_model_from_pretrained"
    "(coca_ViT-L-14, pretrained=FILE).encode_image",
    "keep": "authors: KEEPModel.encode_image (timm ViT-L/16 + visual_head, normalised)",
}
# ours -> the authors' code (kind, architecture), where TRIDENT has no offline loader
AUTHORS = {
    "hibou-b": ("hibou", "vit_base"),
    "hibou-l": ("hibou", "vit_large"),
    "musk": ("musk", "musk_large_patch16_384"),
}
# ours -> the authors' hub constructor (facebookresearch/dinov3, `--dinov3`), in this process
DINOV3 = {
    name: f"dinov3_{name.split('-', 1)[1]}"
    for name in ("dinov3-vits16", "dinov3-vits16plus", "dinov3-vitb16", "dinov3-vitl16",
                 "dinov3-vith16plus", "dinov3-vit7b16")
}  # fmt: skip
# the registered encoders with no reference that runs offline, and why
NO_REFERENCE: dict[str, str] = {}
# published layouts made by the reference's own constructor (ours converts them)
MADE_BY_REFERENCE = {"chief-ctranspath": "ctranspath", "openmidnight": "dinov2"}
TILES = 16
DEVICE = os.environ.get("BENCH_DEVICE", "cuda")  # cpu: a smoke run without a GPU
# the autocast dtype of each registered precision (`--precision authors`); None: fp32
AUTOCAST = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}
H0_REVISION = "0" * 40


def randomize(module: torch.nn.Module, seed: int) -> None:
    """Random weights that make every part count: norms near 1, layer scales near 0.1 (not
    1e-5: blocks would barely change the tokens, and any block would pass), the rest small."""
    generator = torch.Generator().manual_seed(seed)
    norms = (torch.nn.LayerNorm, torch.nn.BatchNorm2d, torch.nn.GroupNorm)
    with torch.no_grad():
        for mname, sub in module.named_modules():
            for pname, tensor in list(sub.named_parameters(recurse=False)) + list(
                sub.named_buffers(recurse=False)
            ):
                full = f"{mname}.{pname}"
                if not tensor.is_floating_point() or any(
                    buffer in full
                    for buffer in ("attn_mask", "position_ids", "rope_embed.periods", "bias_mask")
                ):
                    continue  # computed at build, or a model's constants (rotary periods)
                noise = torch.randn(tensor.shape, generator=generator)
                if "running_var" in pname:
                    value = torch.rand(tensor.shape, generator=generator) + 0.5
                elif isinstance(sub, norms) and pname == "weight":
                    value = 1 + 0.1 * noise
                elif (
                    pname in ("gamma", "lambda1")
                    or "layer_scale" in mname
                    or "ls1" in mname
                    or "ls2" in mname
                ):
                    value = 0.1 + 0.02 * noise
                else:
                    value = 0.02 * noise
                tensor.copy_(value.to(tensor.dtype))


def real_tiles(size: int, count: int | None = None) -> np.ndarray:
    """`count` tiles of `size` px from CMU-1-Small-Region (level 0, tissue-rich places)."""
    import tifffile

    data = Path(os.environ.get("TILESTORE_DATA", REPO.parent / "shared" / "data"))
    path = next(data.rglob("CMU-1-Small-Region.svs"))
    image = tifffile.imread(path, key=0)
    rng = np.random.default_rng(size)
    h, w = image.shape[:2]
    count = count or int(os.environ.get("BENCH_TILES", TILES))
    out = []
    while len(out) < count:
        y, x = rng.integers(0, h - size), rng.integers(0, w - size)
        tile = image[y : y + size, x : x + size]
        if tile.mean() < 215:  # tissue, not glass
            out.append(tile)
    return np.stack(out)


# -- the reference process ---------------------------------------------------------------------


def worker() -> None:
    """Reads one JSON job per line (make a checkpoint, or embed with a reference), answers
    one line each. Runs with the reference's own packages first on its path."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    import huggingface_hub

    # timm 0.9.16 imports upload helpers that huggingface_hub 1.x dropped, and without them
    # disables its hub downloads; the download path it uses is unchanged: stand-ins that fail
    if not hasattr(huggingface_hub, "repo_type_and_id_from_hf_id"):

        def _upload_only(*args, **kwargs):
            raise NotImplementedError("not used by this benchmark")

        huggingface_hub.repo_type_and_id_from_hf_id = _upload_only
    _trident_encoders_only()
    answers, sys.stdout = sys.stdout, sys.stderr  # what the references print is not an answer
    for line in sys.stdin:
        job = json.loads(line)
        try:
            answer = {"make": _make_reference_checkpoint, "embed": _reference_features}[job["do"]](
                job
            )
        except Exception as exc:  # reported in the table, the run goes on
            import traceback

            traceback.print_exc()
            answer = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
        print(json.dumps(answer), file=answers, flush=True)


def _trident_encoders_only() -> None:
    """`trident` as a package entry whose `__init__` is not run (it imports TRIDENT's slide
    readers and pipeline), so `trident.patch_encoder_models` imports just the encoders."""
    import importlib.util
    import types

    spec = importlib.util.find_spec("trident")
    if spec is None or not spec.submodule_search_locations:
        return
    package = types.ModuleType("trident")
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules["trident"] = package


def _make_reference_checkpoint(job: dict) -> dict:
    folder = Path(job["folder"])
    folder.mkdir(parents=True, exist_ok=True)
    if job["kind"] == "ctranspath":
        from trident.patch_encoder_models.model_zoo.ctranspath.ctran import ctranspath

        model = ctranspath(img_size=224)
        model.head = torch.nn.Identity()
        randomize(model, job["seed"])
        path = folder / "CHIEF_CTransPath.pth"
        torch.save({"model": model.state_dict()}, path)
    elif job["kind"] == "dinov2":
        model = torch.hub.load(job["dinov2"], "dinov2_vitg14_reg", source="local", pretrained=False)
        model.pos_embed = torch.nn.Parameter(torch.zeros(1, 1 + 16 * 16, model.embed_dim))
        randomize(model, job["seed"])
        path = folder / "teacher_checkpoint_load.pt"
        torch.save(model.state_dict(), path)
    elif job["kind"] == "hibou":
        from hibou import build_model

        model = build_model(None, arch=job["arch"])
        randomize(model, job["seed"])
        path = folder / "model.pth"
        torch.save(model.state_dict(), path)
    elif job["kind"] == "musk":  # the Hub's model.safetensors: the whole MUSK state
        import safetensors.torch
        import timm
        from musk import modeling  # noqa: F401  (registers musk_large_patch16_384 with timm)

        model = timm.create_model(job["arch"])
        randomize(model, job["seed"])
        path = folder / "model.safetensors"
        safetensors.torch.save_file(
            {k: v.contiguous() for k, v in model.state_dict().items()}, path
        )
    else:
        raise ValueError(job["kind"])
    return {"path": str(path)}


def _authors_encoder(job: dict):
    """The authors' model and TRIDENT's transform for it (as `encoder_factory` gives); MUSK
    with its README's."""
    kind, arch = job["reference"].split(":")
    if kind == "musk":
        return _musk_encoder(job["weights"], arch)
    if kind != "hibou":
        raise ValueError(kind)
    from hibou import build_model
    from torchvision.transforms import InterpolationMode
    from trident.patch_encoder_models.utils.constants import get_constants
    from trident.patch_encoder_models.utils.transform_utils import get_eval_transforms

    model = build_model(job["weights"], arch=arch).eval()
    mean, std = get_constants("hibou")
    model.eval_transforms = get_eval_transforms(
        mean, std, target_img_size=224, interpolation=InterpolationMode.BICUBIC,
        max_size=None, antialias=True,
    )  # fmt: skip
    return model


def _musk_encoder(weights: str, arch: str):
    """MUSK as its README runs it for linear probes and MIL: their model, their loader of the
    checkpoint, ``model(image=x, with_head=False, out_norm=False, ms_aug=True,
    return_global=True)[0]``, their transform (bicubic resize to 384, centre crop, 0.5s)."""
    import timm
    import torchvision.transforms as T
    from musk import modeling, utils  # noqa: F401  (registers musk_large_patch16_384)

    class Musk(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = timm.create_model(arch)
            utils.load_model_and_may_interpolate(weights, self.model, "model|module", "")
            self.eval_transforms = T.Compose([
                T.Resize(384, interpolation=3, antialias=True), T.CenterCrop((384, 384)),
                T.ToTensor(), T.Normalize(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)),
            ])  # fmt: skip

        def forward(self, x):
            return self.model(
                image=x, with_head=False, out_norm=False, ms_aug=True, return_global=True
            )[0]

    return Musk().eval()


def _reference_features(job: dict) -> dict:
    from PIL import Image

    name, kwargs = job["reference"], job["kwargs"]
    if job.get("dinov2"):  # OpenMidnight's backbone: torch.hub, served from the local copy
        load = torch.hub.load
        torch.hub.load = lambda repo, model, **kw: load(
            job["dinov2"], model, source="local", **{k: v for k, v in kw.items() if k != "source"}
        )
    if ":" in name:  # the authors' code
        encoder = _authors_encoder(job).to(DEVICE)
    else:
        from trident.patch_encoder_models import load as trident_load

        trident_load.BasePatchEncoder._has_internet = True  # H0-mini: a local HF cache
        weights = {"weights_path": job["weights"]} if job.get("weights") else {}
        encoder = trident_load.encoder_factory(name, **weights, **kwargs).eval().to(DEVICE)
    out = {}
    for key, path in job["tiles"].items():
        tiles = np.load(path)
        x = torch.stack([encoder.eval_transforms(Image.fromarray(t)) for t in tiles]).to(DEVICE)
        with torch.inference_mode(), _autocast(job.get("precision", "fp32")):
            features = encoder(x).float().cpu().numpy()
        np.save(path.replace(".npy", ".ref.npy"), features)
        out[key] = path.replace(".npy", ".ref.npy")
    return out


def _autocast(precision: str):
    """Autocast in a registered precision (fp16, bf16) on the bench's device; fp32: none."""
    import contextlib

    dtype = AUTOCAST[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(DEVICE).type, dtype=dtype)


# -- this process --------------------------------------------------------------------------


class Reference:
    """The reference process, kept running across encoders."""

    def __init__(self, path: str, sources: list[Path], env: dict):
        paths = [str(p) for p in sources] + [p for p in path.split(":") if p]
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **env, "PYTHONPATH": ":".join(paths)},
        )

    def ask(self, job: dict) -> dict:
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline() or '{"error": "the reference process ended"}')

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def _our_checkpoint(spec, folder: Path, seed: int) -> Path:
    """Random weights in the layout the authors publish, made from our own build."""
    from tilestore.embed.models.families import build

    folder.mkdir(parents=True, exist_ok=True)
    with torch.device(DEVICE):
        backbone = build(spec)
    randomize(backbone, seed)
    if spec.family == "transformers":
        backbone.model.save_pretrained(folder)
        return folder / "model.safetensors"
    state = {k: v.detach().cpu().contiguous() for k, v in backbone.state_dict().items()}
    del backbone
    if spec.family == "conch" and spec.arch.name == "v1":
        state = {f"visual.{k}": v for k, v in state.items()}
    if spec.family == "conch" and spec.arch.name == "v1.5":  # published for 224 px
        generator = torch.Generator().manual_seed(seed)
        state["trunk.pos_embed"] = 0.02 * torch.randn(1, 197, 1024, generator=generator)
    name = Path(spec.weights_file).name if spec.weights_file else "pytorch_model.bin"
    torch.save(state, folder / name)
    return folder / name


def _hub_cache(root: Path, repo: str, config: dict, state: dict) -> None:
    """A Hugging Face cache entry as huggingface_hub lays it out."""
    import safetensors.torch

    entry = root / "hub" / f"models--{repo.replace('/', '--')}"
    snapshot = entry / "snapshots" / H0_REVISION
    snapshot.mkdir(parents=True, exist_ok=True)
    (entry / "refs").mkdir(exist_ok=True)
    (entry / "refs" / "main").write_text(H0_REVISION)
    (snapshot / "config.json").write_text(json.dumps(config))
    safetensors.torch.save_file(
        {k: v.detach().cpu().contiguous() for k, v in state.items()}, snapshot / "model.safetensors"
    )


def _timm_hub_config(spec) -> dict:
    from tilestore.embed.models.families import build

    with torch.device("meta"):
        backbone = build(spec)
    return {
        "architecture": spec.arch.name,
        "num_classes": 0,
        "model_args": {
            k: v for k, v in spec.arch.kwargs.items() if k not in ("mlp_layer", "act_layer")
        },
        "pretrained_cfg": {
            key: list(value) if isinstance(value, tuple) else value
            for key, value in {**backbone.pretrained_cfg, **spec.data}.items()
            if key in ("input_size", "interpolation", "crop_pct", "mean", "std")
        },
    }


# -- image-text checkpoints: the authors' whole model, random, in its published layout ---------

# MedSigLIP's text tower (SigLIP-400M's), as its config.json gives it
SIGLIP_TEXT = {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27,
               "num_attention_heads": 16, "vocab_size": 32000, "max_position_embeddings": 64,
               "pad_token_id": 1, "eos_token_id": 1, "bos_token_id": 2}  # fmt: skip
WORDS = ["an", "the", "of", "a", "image", "photomicrograph", "showing", "h&e", "stained",
         "histopathological", "tumor", "carcinoma", "invasive", "adenocarcinoma", "stroma",
         "fibrous", "normal", "benign", "tissue", "lymphocytes", "necrosis", ".", ","]  # fmt: skip


class Whole:
    """A reference image-text model: `image(pixels)` its image embedding as its library
    gives it, `texts(list)` its text embeddings, `scale`/`bias` its logit constants."""

    def __init__(self, image, texts, scale: float, bias=0.0, model=None, tokenizer=None):
        self.image, self.texts, self.scale, self.bias, self.model = image, texts, scale, bias, model
        self.tokenizer = tokenizer


def _word_tokenizer(folder: Path, bos: str, eos: str, pad: str) -> None:
    """A word-level tokenizer saved where transformers reads one (the real ones are not
    on this machine; both sides read this one)."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(dict.fromkeys([pad, eos, bos, "<unk>", *WORDS]))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", special_tokens=[(bos, vocab[bos]), (eos, vocab[eos])]
    )
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=pad, unk_token="<unk>"
    ).save_pretrained(folder)


def image_text_checkpoint(
    spec, folder: Path, seed: int, conch: Path | None = None, musk: Path | None = None
) -> Whole:
    """The model's whole checkpoint (image and text towers) made by its reference library,
    random, saved in the layout its authors publish into `folder`; the reference model."""
    folder.mkdir(parents=True, exist_ok=True)
    if spec.text == "musk":
        return _musk_whole(folder, seed, musk)
    if spec.text in ("clip", "siglip"):
        import transformers

        vision = {k: v for k, v in spec.arch.kwargs.items() if k != "projection_dim"}
        if spec.text == "clip":
            config = transformers.CLIPConfig(
                vision_config=vision, projection_dim=spec.arch.kwargs["projection_dim"],
                text_config={"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0})  # fmt: skip
            model = transformers.CLIPModel(config)
            tokens = dict(padding=True)
            _word_tokenizer(folder, "<|startoftext|>", "<|endoftext|>", "<pad>")
        else:
            config = transformers.SiglipConfig(vision_config=vision, text_config=SIGLIP_TEXT)
            model = transformers.SiglipModel(config)
            tokens = dict(padding="max_length", max_length=64)
            _word_tokenizer(folder, "<s>", "</s>", "<pad>")
        randomize(model, seed)
        model.save_pretrained(folder)
        model = model.to(DEVICE).eval()
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)

        def texts(batch):
            ids = tokenizer(batch, return_tensors="pt", truncation=True, **tokens).to(DEVICE)
            if spec.text == "siglip":
                ids = {"input_ids": ids["input_ids"]}
            out = model.get_text_features(**ids)
            return getattr(out, "pooler_output", out)

        def image(pixels):
            out = model.get_image_features(pixel_values=pixels)
            return getattr(out, "pooler_output", out)

        bias = float(model.logit_bias) if spec.text == "siglip" else 0.0
        return Whole(image, texts, float(model.logit_scale.exp()), bias, model)
    if spec.text == "open_clip":
        import open_clip

        from tilestore.embed.models.families import is_coca

        if open_clip.get_model_config(spec.arch.name) is None:  # BiomedCLIP: its own config
            return _open_clip_hub_whole(spec, folder, seed)
        config = open_clip.get_model_config(spec.arch.name)
        weights = folder / spec.weights_file
        if is_coca(config):  # OmiCLIP: a training run's checkpoint, as Loki's loads it
            arguments = {k: v for k, v in config.items() if k != "custom_text"}
            made = open_clip.coca_model.CoCa(**arguments)
            randomize(made, seed)
            state = {f"module.{k}": v for k, v in made.state_dict().items()}  # DDP's names
            run = {"epoch": 30, "name": spec.name, "loss": np.float64(0.5),
                   "args": argparse.Namespace(model=spec.arch.name)}  # fmt: skip
            torch.save({**run, "state_dict": state}, weights)
            model, _ = open_clip.create_model_from_pretrained(
                spec.arch.name,
                pretrained=str(weights),
                weights_only=False,  # LazySlide's
            )
            model = model.to(DEVICE).eval()
        else:
            made = open_clip.model.CLIP(**config)
            randomize(made, seed)
            torch.save(made.state_dict(), weights)
            model = open_clip.create_model(spec.arch.name, pretrained=str(weights)).to(DEVICE)
            model = model.eval()
        tokenizer = open_clip.get_tokenizer(spec.arch.name)
        return Whole(model.encode_image, lambda b: model.encode_text(tokenizer(b).to(DEVICE)),
                     float(model.logit_scale.exp()), model=model)  # fmt: skip
    if spec.text == "conch":
        if conch is not None and str(conch) not in sys.path:
            sys.path.insert(0, str(conch))
        from conch.open_clip_custom.coca_model import CoCa
        from conch.open_clip_custom.custom_tokenizer import get_tokenizer, tokenize

        root = Path(sys.modules["conch.open_clip_custom.coca_model"].__file__).parent
        config = json.loads((root / "model_configs" / "conch_ViT-B-16.json").read_text())
        config.pop("custom_text")
        model = CoCa(**config)
        randomize(model, seed)
        torch.save(model.state_dict(), folder / "pytorch_model.bin")
        model = model.to(DEVICE).eval()
        tokenizer = get_tokenizer()
        if not hasattr(tokenizer, "batch_encode_plus"):  # transformers 5 dropped the name
            tokenizer.batch_encode_plus = tokenizer.__call__
        return Whole(
            lambda x: model.encode_image(x, normalize=False, proj_contrast=False),
            lambda b: model.encode_text(tokenize(tokenizer, b).to(DEVICE), normalize=False),
            float(model.logit_scale.exp()), model=model, tokenizer=tokenizer,
        )  # fmt: skip
    if spec.text == "keep":
        return _keep_whole(folder, seed)
    raise ValueError(f"{spec.name}: no text tower")


def _musk_whole(folder: Path, seed: int, source: Path | None) -> Whole:
    """MUSK as its zero-shot benchmark runs it, from a copy of lilab-stanford/MUSK (`source`,
    on sys.path: their `musk` package and their `benchmarks` folder): their
    ``musk_large_patch16_384`` (timm), random, its whole state saved as the Hub's
    model.safetensors, their tokenizer.spm beside it (ours reads it there); the image
    ``model(image=x, with_head=True, out_norm=True)[0]`` (ms_aug off), the text their
    ``xlm_tokenizer`` (100 tokens) and ``model(text_description=ids, padding_mask=mask,
    with_head=True, out_norm=True)[1]``; `zero_shot_one` takes their benchmark's
    ``zero_shot_classifier`` and its logits (x 100). Their tokenizer, ``XLMRobertaTokenizer``
    of their file, is transformers' own reading of it (transformers 5 takes the file under
    XLM-R's name, through protobuf; transformers 4's slow class took the path)."""
    import safetensors.torch
    import timm
    import transformers

    if source is None:
        raise SystemExit("musk: give --musk (a copy of github.com/lilab-stanford/MUSK)")
    if str(source) not in sys.path:
        sys.path.insert(0, str(source))
    from musk import modeling, utils  # noqa: F401  (registers musk_large_patch16_384)

    model = timm.create_model("musk_large_patch16_384")
    randomize(model, seed)
    with torch.no_grad():
        model.logit_scale.fill_(float(np.log(1 / 0.07)))
    safetensors.torch.save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors"
    )
    spm = source / "musk" / "models" / "tokenizer.spm"
    shutil.copy(spm, folder / "tokenizer.spm")
    xlm = folder / "xlm-r"
    xlm.mkdir()
    shutil.copy(spm, xlm / "sentencepiece.bpe.model")
    tokenizer = transformers.XLMRobertaTokenizer.from_pretrained(xlm)
    model = model.to(DEVICE).eval()

    def texts(batch):
        pairs = [utils.xlm_tokenizer(t, tokenizer, max_len=100) for t in batch]
        ids = torch.tensor([p[0] for p in pairs], device=DEVICE)
        mask = torch.tensor([p[1] for p in pairs], device=DEVICE)
        return model(text_description=ids, padding_mask=mask, with_head=True, out_norm=True)[1]

    def image(pixels):
        return model(image=pixels, with_head=True, out_norm=True)[0]

    # their benchmark's run_classification: logits = 100. * image_features @ classifier
    return Whole(image, texts, 100.0, model=model, tokenizer=tokenizer)


# BiomedBERT-base-uncased-abstract's config.json: BERT-base (its vocabulary is not here)
BERT_BASE = {"model_type": "bert", "architectures": ["BertForMaskedLM"], "vocab_size": 30522,
             "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
             "intermediate_size": 3072, "hidden_act": "gelu", "max_position_embeddings": 512,
             "type_vocab_size": 2, "layer_norm_eps": 1e-12, "pad_token_id": 0}  # fmt: skip


def _snapshot(cache: Path, repo: str) -> Path:
    """A repo's snapshot folder in a Hugging Face cache as huggingface_hub lays it out."""
    entry = cache / f"models--{repo.replace('/', '--')}"
    snapshot = entry / "snapshots" / H0_REVISION
    snapshot.mkdir(parents=True, exist_ok=True)
    (entry / "refs").mkdir(exist_ok=True)
    (entry / "refs" / "main").write_text(H0_REVISION)
    return snapshot


def _open_clip_hub_whole(spec, folder: Path, seed: int) -> Whole:
    """An open_clip model whose text tower is a Hugging Face model (BiomedCLIP), its two Hub
    repos made in a local Hugging Face cache: the BERT's (BERT-base's config, a
    word vocabulary) and the CLIP's (the registry's model_cfg as its open_clip_config.json,
    open_clip's CustomTextCLIP of it with random weights in open_clip_pytorch_model.bin, the
    position ids transformers saved before 4.31 with them, a logit scale of ln 100), the
    CLIP's files in `folder` too. The reference: open_clip's create_model_and_transforms
    and get_tokenizer of ``hf-hub:<repo>``, offline from that cache (ours reads it too)."""
    import huggingface_hub
    import open_clip

    from tilestore.embed.models.families import open_clip_config, open_clip_text_repos

    config = open_clip_config(spec, None)
    # the image check's cache (main sets HF_HOME), else one of this run's (ours reads it per call)
    home = os.environ.get("HF_HOME")
    cache = Path(home) / "hub" if home else folder / "hf"
    os.environ.update(HF_HUB_OFFLINE="1", **({} if home else {"HF_HUB_CACHE": str(cache)}))
    huggingface_hub.constants.HF_HUB_CACHE = str(cache)  # open_clip's and transformers' reads
    huggingface_hub.constants.HF_HUB_OFFLINE = True
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "h", "&", "e", *WORDS]
    for repo in open_clip_text_repos(config):
        snapshot = _snapshot(cache, repo)
        (snapshot / "config.json").write_text(json.dumps(BERT_BASE))
        (snapshot / "vocab.txt").write_text("\n".join(dict.fromkeys(vocab)) + "\n")
    bert = _snapshot(cache, config["text_cfg"]["hf_model_name"])
    text = {**config["text_cfg"], "hf_model_pretrained": False, "hf_model_name": str(bert)}
    made = open_clip.model.CustomTextCLIP(**{**config, "text_cfg": text})
    randomize(made, seed)
    with torch.no_grad():
        made.logit_scale.fill_(float(np.log(100)))
    state = made.state_dict()
    state["text.transformer.embeddings.position_ids"] = torch.arange(512)[None]
    torch.save(state, folder / spec.weights_file)
    del made, state
    preprocess = {"mean": list(spec.data["mean"]), "std": list(spec.data["std"])}
    (folder / "open_clip_config.json").write_text(
        json.dumps({"model_cfg": config, "preprocess_cfg": preprocess})
    )
    snapshot = _snapshot(cache, spec.repo)
    for name in (spec.weights_file, "open_clip_config.json"):
        (snapshot / name).symlink_to(folder / name)
    model, _, _ = open_clip.create_model_and_transforms(f"hf-hub:{spec.repo}", cache_dir=str(cache))
    model = model.to(DEVICE).eval()
    tokenizer = open_clip.get_tokenizer(f"hf-hub:{spec.repo}", cache_dir=str(cache))
    return Whole(model.encode_image, lambda b: model.encode_text(tokenizer(b).to(DEVICE)),
                 float(model.logit_scale.detach().exp()), model=model)  # fmt: skip


def _keep_whole(folder: Path, seed: int) -> Whole:
    """KEEP's release made here as the Hub holds it: the authors' KEEPModel (MAGIC-AI4Med/
    KEEP quick_start/keep_inference.py: timm's vit_large_patch16_224 with their arguments,
    visual_head, BertModel of the config's text_config, BERT-base's size as PubMedBERT's),
    random, its state in model.safetensors with the layer scales named ``weight`` as the
    Hub's remote code names them, config.json, a BERT vocabulary; its encode_image and
    encode_text (256 tokens, lower-cased) are the reference."""
    import safetensors.torch
    import timm
    import torch.nn.functional as F
    import transformers

    class KEEPModel(torch.nn.Module):
        def __init__(self, text_config: dict, projection_dim: int = 768):
            super().__init__()
            self.visual = timm.create_model(
                "vit_large_patch16_224", pretrained=False, img_size=224, patch_size=16,
                init_values=1e-5, num_classes=0, dynamic_img_size=True,
            )  # fmt: skip
            self.visual_head = torch.nn.Sequential(
                torch.nn.Linear(self.visual.num_features, projection_dim),
                torch.nn.GELU(),
                torch.nn.Linear(projection_dim, projection_dim),
            )
            self.text = transformers.BertModel(transformers.BertConfig(**text_config))
            self.logit_scale = torch.nn.Parameter(torch.ones([]) * np.log(1 / 0.04))

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "h", "&", "e", *WORDS]
    text_config = {"vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12,
                   "num_attention_heads": 12, "intermediate_size": 3072,
                   "max_position_embeddings": 512}  # fmt: skip
    model = KEEPModel(text_config)
    randomize(model, seed)
    state = {re.sub(r"\.(ls[12])\.gamma$", r".\1.weight", k): v.contiguous()
             for k, v in model.state_dict().items()}  # fmt: skip
    safetensors.torch.save_file(state, folder / "model.safetensors")
    config = {"model_type": "keep", "architectures": ["KEEPModel"], "projection_dim": 768,
              "text_config": text_config}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "vocab.txt").write_text("\n".join(dict.fromkeys(vocab)) + "\n")
    tokenizer = transformers.BertTokenizer(str(folder / "vocab.txt"), do_lower_case=True)
    tokenizer.save_pretrained(folder)
    model = model.to(DEVICE).eval()

    def image(pixels):
        return F.normalize(model.visual_head(model.visual(pixels)), dim=-1)

    def texts(batch):
        ids = tokenizer(batch, max_length=256, padding="max_length", truncation=True,
                        return_tensors="pt").to(DEVICE)  # fmt: skip
        return F.normalize(model.text(**ids).pooler_output, dim=-1)

    scale = float(model.logit_scale.detach().exp())
    return Whole(image, texts, scale, model=model, tokenizer=tokenizer)


# CONCH's prompts for CRC tissue classes, in the form of its prompts/ files
ZERO_SHOT_PROMPTS = {
    "classnames": {
        "tumor": ["tumor", "carcinoma", "invasive adenocarcinoma"],
        "stroma": ["stroma", "fibrous stroma"],
        "normal": ["normal tissue", "benign tissue"],
        "lymphocytes": ["lymphocytes"],
        "necrosis": ["necrosis"],
    },
    "templates": ["CLASSNAME .", "an image of CLASSNAME .",
                  "a photomicrograph showing CLASSNAME .", "an h&e stained image of CLASSNAME .",
                  "a histopathological image of CLASSNAME ."],
}  # fmt: skip


def zero_shot_one(name: str, args, work: Path) -> dict:
    """Ours (the stored features' path: our image tower, `load_text_tower`,
    `class_embeddings`, `tile_probabilities`) against the reference's own zero-shot on real
    tiles: CONCH's `zero_shot_classifier` and `encode_image` with its projection; CLIP's,
    SigLIP's and open_clip's text and image embeddings ensembled as CONCH's function does."""
    import torch.nn.functional as F

    from tilestore.embed.models import get_model
    from tilestore.embed.models.text import load_text_tower
    from tilestore.embed.prompts import Prompts
    from tilestore.embed.zeroshot import class_embeddings, tile_probabilities

    spec = get_model(name)
    folder = work / f"zs-{name}"
    shutil.rmtree(folder, ignore_errors=True)
    whole = image_text_checkpoint(spec, folder, abs(hash(name)) % 2**31, args.conch, args.musk)
    size = spec.data["input_size"][-1]
    tiles = real_tiles(size, args.tiles)
    np.save(folder / "input.npy", tiles)
    features = torch.from_numpy(ours(spec, {"t": str(folder / "input.npy")}, folder)["t"])
    prompts = Prompts("bench", {k: tuple(v) for k, v in ZERO_SHOT_PROMPTS["classnames"].items()},
                      tuple(ZERO_SHOT_PROMPTS["templates"]))  # fmt: skip
    tower = load_text_tower(spec, weights=folder, device=DEVICE)
    classes = class_embeddings(tower, prompts)
    # stored in the joint space already, or taken there by the tower's head (CONCH, MUSK)
    stored_joint = spec.projection == tower.stored_joint
    mine = tile_probabilities(tower, classes, features.to(DEVICE), stored_joint)[0]
    mean = torch.tensor(spec.data["mean"]).view(1, 3, 1, 1).to(DEVICE)
    std = torch.tensor(spec.data["std"]).view(1, 3, 1, 1).to(DEVICE)
    x = (torch.from_numpy(tiles).to(DEVICE).permute(0, 3, 1, 2).float() / 255 - mean) / std
    with torch.inference_mode():
        if spec.text == "musk":  # their benchmark's classifier and logits
            from benchmarks.clip_benchmark.metrics import zeroshot_classification as theirs_zs

            texts = {c: prompts.texts(c) for c in prompts.names}  # their class-specific prompts
            theirs_classes = theirs_zs.zero_shot_classifier(
                whole.model, whole.tokenizer, prompts.names, texts, DEVICE, amp=False
            ).T
            image = whole.image(x)  # with_head, out_norm: unit
        elif spec.text == "conch":
            from conch.downstream.zeroshot_path import zero_shot_classifier

            names = list(ZERO_SHOT_PROMPTS["classnames"].values())
            theirs_classes = zero_shot_classifier(whole.model, names,
                                                  ZERO_SHOT_PROMPTS["templates"],
                                                  whole.tokenizer, DEVICE).T  # fmt: skip
            image = whole.model.encode_image(x, normalize=True, proj_contrast=True)
        else:
            rows = [F.normalize(F.normalize(whole.texts(prompts.texts(c)), dim=-1).mean(0), dim=0)
                    for c in prompts.names]  # fmt: skip
            theirs_classes = torch.stack(rows)
            image = F.normalize(whole.image(x), dim=-1)
        logits = whole.scale * image @ theirs_classes.T + whole.bias
        theirs = torch.softmax(logits, dim=-1)
    shutil.rmtree(folder, ignore_errors=True)
    a, b = mine.float().cpu().numpy(), theirs.float().cpu().numpy()
    return {
        "encoder": name, "text": spec.text, "tiles": len(tiles), "classes": len(prompts.names),
        "prompts": sum(len(prompts.texts(c)) for c in prompts.names),
        "class_embeddings": compare(classes.float().cpu().numpy(),
                                    theirs_classes.float().cpu().numpy()),
        "max_abs_prob_diff": float(np.abs(a - b).max()),
        "same_top_class": float((a.argmax(1) == b.argmax(1)).mean()),
    }  # fmt: skip


def ours(
    spec, tiles: dict[str, str], folder: Path | None, precision: str = "fp32"
) -> dict[str, np.ndarray]:
    from dataclasses import replace

    from tilestore.embed.models import load_model

    local = replace(spec, source="local", repo=str(folder)) if folder else spec
    loaded = load_model(local, device=DEVICE)
    out = {}
    for key, path in tiles.items():
        x = torch.from_numpy(np.load(path)).to(DEVICE)
        with torch.inference_mode():
            x = loaded.transform(x)  # in float32, outside autocast, as the engine runs it
            with _autocast(precision):
                out[key] = loaded.features(x).float().cpu().numpy()
    del loaded
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return out


def compare(a: np.ndarray, b: np.ndarray) -> dict:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    cos = (a64 * b64).sum(1) / (np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1))
    return {"cosine_min": float(cos.min()), "max_abs_diff": float(np.abs(a64 - b64).max()),
            "max_abs": float(np.abs(b64).max())}  # fmt: skip


def run_one(name: str, args, reference: Reference | None, work: Path) -> dict:
    from tilestore.embed.models import get_model
    from tilestore.embed.models.load import data_config

    spec = get_model(name)
    seed = abs(hash(name)) % 2**31
    folder = work / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    with torch.device("meta"):
        from tilestore.embed.models.encoder import Encoder
        from tilestore.embed.models.families import build

        size = data_config(spec, Encoder.of(build(spec), spec))["input_size"][-1]
    # tiles at the input size (the transforms' resize is the identity: the model alone is
    # compared) and, where it differs, at the tile size our plan reads for it
    tiles = {"at_input": str(folder / "input.npy")}
    np.save(tiles["at_input"], real_tiles(size, args.tiles))
    if spec.tile != size:
        tiles["at_tile"] = str(folder / "tile.npy")
        np.save(tiles["at_tile"], real_tiles(spec.tile, args.tiles))
    precision = spec.precision if args.precision == "authors" else "fp32"
    row = {"encoder": name, "family": spec.family, "pooling": spec.pooling,
           "dim": spec.output_dim, "input": size, "tile": spec.tile,
           "precision": precision}  # fmt: skip
    started = time.perf_counter()
    if name in TRIDENT:
        trident_name, kwargs = TRIDENT[name]
        row["reference"] = f"TRIDENT {trident_name}" + (f" {kwargs}" if kwargs else "")
        job = {"do": "embed", "reference": trident_name, "kwargs": kwargs, "tiles": tiles,
               "precision": precision}  # fmt: skip
        if name in MADE_BY_REFERENCE:
            kind = MADE_BY_REFERENCE[name]
            made = reference.ask(
                {"do": "make", "kind": kind, "folder": str(folder), "seed": seed,
                 "dinov2": str(args.dinov2)}
            )  # fmt: skip
            if "error" in made:
                return {**row, "error": "making the checkpoint: " + made["error"]}
            job["weights"] = made["path"]
            job["dinov2"] = str(args.dinov2) if name == "openmidnight" else None
            mine = ours(spec, tiles, folder, precision)
        elif name in HUB_CACHE:
            from tilestore.embed.models.families import build

            with torch.device(DEVICE):
                backbone = build(spec)
            randomize(backbone, seed)
            _hub_cache(
                Path(os.environ["HF_HOME"]),
                spec.repo,
                _timm_hub_config(spec),
                backbone.state_dict(),
            )
            del backbone
            mine = ours(spec, tiles, None, precision)
        else:
            job["weights"] = str(_our_checkpoint(spec, folder, seed))
            mine = ours(spec, tiles, folder, precision)
        theirs = reference.ask(job)
        if "error" in theirs:
            return {**row, "error": theirs["error"]}
        theirs = {k: np.load(v) for k, v in theirs.items()}
    elif name in AUTHORS:
        kind, arch = AUTHORS[name]
        row["reference"] = f"authors: {kind} {arch}"
        made = reference.ask(
            {"do": "make", "kind": kind, "arch": arch, "folder": str(folder), "seed": seed}
        )
        if "error" in made:
            return {**row, "error": "making the checkpoint: " + made["error"]}
        mine = ours(spec, tiles, folder, precision)
        theirs = reference.ask(
            {"do": "embed", "reference": f"{kind}:{arch}", "kwargs": {}, "tiles": tiles,
             "weights": made["path"], "precision": precision}
        )  # fmt: skip
        if "error" in theirs:
            return {**row, "error": theirs["error"]}
        theirs = {k: np.load(v) for k, v in theirs.items()}
    elif name in TIMM_HUB:
        import timm
        from PIL import Image

        from tilestore.embed.models.families import build

        row["reference"] = "timm create_model(hf-hub:...) + create_transform"
        with torch.device(DEVICE):
            backbone = build(spec)
        randomize(backbone, seed)
        _hub_cache(
            Path(os.environ["HF_HOME"]), spec.repo, _timm_hub_config(spec), backbone.state_dict()
        )
        del backbone
        mine = ours(spec, tiles, None, precision)
        model = (
            timm.create_model(f"hf-hub:{spec.repo}", pretrained=True, num_classes=0)
            .to(DEVICE)
            .eval()
        )
        transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=model))
        theirs = {}
        for key, path in tiles.items():
            x = torch.stack([transform(Image.fromarray(t)) for t in np.load(path)]).to(DEVICE)
            with torch.inference_mode(), _autocast(precision):
                theirs[key] = model(x).float().cpu().numpy()
    elif name in DINOV3:
        if args.dinov3 is None:
            return {**row, "error": "needs --dinov3 (a copy of facebookresearch/dinov3)"}
        row["reference"] = f"authors: {DINOV3[name]}().forward_features()['x_norm_clstoken']"
        mine, theirs = _dinov3(spec, DINOV3[name], tiles, folder, seed, precision, args.dinov3)
    elif name == "isight":
        row["reference"] = OTHER[name]
        mine, theirs = _isight(spec, tiles, folder, seed, precision)
    elif name in OTHER:
        row["reference"] = OTHER[name]
        whole = image_text_checkpoint(spec, folder, seed)
        mine = ours(spec, tiles, folder, precision)
        processor_mean = torch.tensor(spec.data["mean"]).view(1, 3, 1, 1).to(DEVICE)
        processor_std = torch.tensor(spec.data["std"]).view(1, 3, 1, 1).to(DEVICE)
        theirs = {}
        for key, path in tiles.items():
            if key != "at_input":
                continue  # the processors resize with PIL; the model alone is the check
            x = torch.from_numpy(np.load(path)).to(DEVICE).permute(0, 3, 1, 2).float() / 255
            with torch.inference_mode(), _autocast(precision):
                theirs[key] = (
                    whole.image((x - processor_mean) / processor_std).float().cpu().numpy()
                )
    else:
        return {**row, "reference": "none", "why": NO_REFERENCE.get(name, "no offline reference")}
    row["seconds"] = round(time.perf_counter() - started, 1)
    for key in theirs:
        a, b = mine[key], theirs[key]
        if spec.pooling == "cls+mean" and a.shape[1] == 2 * b.shape[1]:
            a = a[:, : b.shape[1]]
            row["note"] = "the reference gives the CLS token only: compared with ours' CLS half"
        elif name == "virchow2-cls" and 2 * a.shape[1] == b.shape[1]:
            b = b[:, : a.shape[1]]
            row["note"] = "the reference gives CLS + mean: ours compared with its CLS half"
        row[key] = compare(a, b)
    shutil.rmtree(folder, ignore_errors=True)
    return row


def _dinov3(spec, maker: str, tiles: dict, folder: Path, seed: int, precision: str, code: Path):
    """DINOv3's release made here: the authors' model (facebookresearch/dinov3's hub
    constructor, ``pretrained=False``), random, its rotary periods stored in bfloat16 as
    their release stores them and read back into it; converted to timm's layout by timm's
    own ``checkpoint_filter_fn`` (how the ``timm/`` copies ours loads were made) and saved as
    such a repo is (config.json, model.safetensors), read by ours. The authors' model embeds
    the same tiles, normalised as their README's transform does (at the input size its
    resize is the identity): ``forward_features(x)["x_norm_clstoken"]``."""
    import importlib

    import safetensors.torch
    import timm

    from tilestore.embed.models.families import build

    sys.path.insert(0, str(code))
    try:
        theirs = getattr(importlib.import_module("dinov3.hub.backbones"), maker)(pretrained=False)
    finally:
        sys.path.remove(str(code))
    randomize(theirs, seed)
    state = {k: v.detach().cpu().contiguous() for k, v in theirs.state_dict().items()}
    state["rope_embed.periods"] = state["rope_embed.periods"].to(torch.bfloat16)  # as released
    theirs.load_state_dict(state, strict=True)
    with torch.device("meta"):
        converted = timm.models.eva.checkpoint_filter_fn(state, build(spec))
    del state
    (folder / "config.json").write_text(json.dumps(_timm_hub_config(spec)))
    safetensors.torch.save_file(
        {k: v.contiguous() for k, v in converted.items()}, folder / "model.safetensors"
    )
    del converted
    mine = ours(spec, tiles, folder, precision)
    theirs = theirs.to(DEVICE).eval()
    mean = torch.tensor(spec.data["mean"], device=DEVICE).view(1, 3, 1, 1)
    std = torch.tensor(spec.data["std"], device=DEVICE).view(1, 3, 1, 1)
    out = {}
    for key, path in tiles.items():
        if key != "at_input":
            continue
        x = torch.from_numpy(np.load(path)).to(DEVICE).permute(0, 3, 1, 2).float() / 255
        with torch.inference_mode(), _autocast(precision):
            tokens = theirs.forward_features((x - mean) / std)["x_norm_clstoken"]
            out[key] = tokens.float().cpu().numpy()
    return mine, out


def _isight(spec, tiles: dict[str, str], folder: Path, seed: int, precision: str):
    """iSight's release made here (a training checkpoint: ``model_state_dict`` of the
    authors' CLAM_ViT, random), read by ours; the authors' construction embeds the same
    tiles: openai/clip-vit-large-patch14-336's CLIPModel (text tower too) loaded strictly
    from the ``patch_encoder.`` keys, ``vision_model(..., output_hidden_states=True)
    .hidden_states[-1]``, their ``visual_token_projection``, the mean over every token.
    CLIP's processor resizes with PIL: at the 336 px input its resize and crop are the
    identity, so the model alone is compared, normalised as the processor does."""
    import transformers

    from tilestore.embed.models.zoo import ISIGHT_CLIP

    vision = {k: v for k, v in ISIGHT_CLIP.items() if k != "projection_dim"}
    text = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
            "num_attention_heads": 12, "max_position_embeddings": 77}  # fmt: skip
    config = transformers.CLIPConfig(
        vision_config=vision, text_config=text, projection_dim=ISIGHT_CLIP["projection_dim"]
    )
    clip = transformers.CLIPModel(config)
    projection = torch.nn.Linear(vision["hidden_size"], vision["hidden_size"])
    randomize(clip, seed)
    randomize(projection, seed + 1)
    state = {f"patch_encoder.{k}": v for k, v in clip.state_dict().items()}
    state |= {f"visual_token_projection.{k}": v for k, v in projection.state_dict().items()}
    state |= {"classifiers.0.weight": torch.zeros(4, vision["hidden_size"])}  # a task head
    torch.save({"epoch": 0, "model_state_dict": state}, folder / Path(spec.weights_file).name)
    del state
    mine = ours(spec, tiles, folder, precision)
    clip, projection = clip.to(DEVICE).eval(), projection.to(DEVICE).eval()
    mean = torch.tensor(spec.data["mean"], device=DEVICE).view(1, 3, 1, 1)
    std = torch.tensor(spec.data["std"], device=DEVICE).view(1, 3, 1, 1)
    theirs = {}
    for key, path in tiles.items():
        x = torch.from_numpy(np.load(path)).to(DEVICE).permute(0, 3, 1, 2).float() / 255
        with torch.inference_mode(), _autocast(precision):
            out = clip.vision_model((x - mean) / std, output_hidden_states=True)
            theirs[key] = projection(out.hidden_states[-1]).mean(dim=1).float().cpu().numpy()
    return mine, theirs


def profile(names: list[str], batches: tuple[int, ...], repeats: int, out: Path) -> None:
    """`tilestore models profile random:<name>` for each: the registered architecture with
    random weights (the cost is the architecture's), bf16 on the GPU; the batch
    `--batch-size auto` would take, its tiles/s and peak GPU memory."""
    from dataclasses import asdict

    from tilestore.embed.models import get_model
    from tilestore.embed.sizing import profile_model

    rows = []
    for name in names:
        spec = get_model(name)
        try:
            found = profile_model(f"random:{name}", batches, repeats=repeats)
        except Exception as exc:  # reported in the table, the others go on
            rows.append({"encoder": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
            print(f"{name}: {rows[-1]['error']}", flush=True)
            continue
        chosen = found.choose()
        run = next(r for r in found.runs if r.batch == chosen)
        row = {"encoder": name, "family": spec.family, "architecture": spec.arch.name,
               "input": spec.data.get("input_size", (3, 224, 224))[-1], "batch": chosen,
               "tiles_per_s": run.tiles_per_s, "peak_mb": run.peak_mb,
               "model_mb": found.model_mb, "profile": asdict(found)}  # fmt: skip
        rows.append(row)
        print(f"{name}: {json.dumps({k: v for k, v in row.items() if k != 'profile'})}", flush=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"device": device, "torch": torch.__version__, "rows": rows}, indent=2)
    )
    precision = next((r["profile"]["precision"] for r in rows if "profile" in r), "-")
    print(f"\n{device}, {precision}, random weights, eager; batches {batches}, {repeats} timed")
    print("| encoder | family | architecture | input px | batch chosen | tiles/s | peak GPU MB | "
          "model MB |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['encoder']} | error: {r['error']} | | | | | | |")
            continue
        print(f"| {r['encoder']} | {r['family']} | {r['architecture']} | {r['input']} | "
              f"{r['batch']} | {r['tiles_per_s']:,.0f} | {_mb(r['peak_mb'])} | "
              f"{_mb(r['model_mb'])} |")  # fmt: skip
    print(f"json: {out}")


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--trident", type=Path)
    parser.add_argument("--conch", type=Path)
    parser.add_argument("--dinov2", type=Path)
    parser.add_argument("--hibou", type=Path, help="a copy of HistAI/hibou")
    parser.add_argument("--dinov3", type=Path, help="a copy of facebookresearch/dinov3")
    parser.add_argument("--musk", type=Path, help="a copy of lilab-stanford/MUSK")
    parser.add_argument("--reference-path", default="", help="PYTHONPATH of the reference process")
    parser.add_argument("--models", default="", help="comma-separated; default: all")
    parser.add_argument(
        "--profile",
        default="",
        help="instead of the reference check: `models profile` of these registered encoders "
        "(comma-separated), random weights, bf16",
    )
    parser.add_argument(
        "--zero-shot",
        default="",
        help="instead of the image check: zero-shot of these image-text encoders "
        "(comma-separated; conch-v1 needs --conch, musk --musk), ours against the reference's, "
        "CONCH-style "
        "prompts on CMU-1 tiles, random weights",
    )
    parser.add_argument("--batches", default="64,128,256,512,1024")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--precision",
        choices=("fp32", "authors"),
        default="fp32",
        help="fp32 (TF32 off), or autocast in each model's registered precision (fp16, bf16)",
    )
    parser.add_argument(
        "--device", default=None, help="cuda (default) or cpu; overrides BENCH_DEVICE"
    )
    parser.add_argument(
        "--tiles", type=int, default=TILES, help="tiles per encoder (fewer: a CPU smoke run)"
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/encoders-bench"))
    parser.add_argument("--json", type=Path, default=HERE / "results" / "encoders.json")
    args = parser.parse_args()
    if args.device:  # this process and the reference's
        global DEVICE
        DEVICE = os.environ["BENCH_DEVICE"] = args.device
    os.environ["BENCH_TILES"] = str(args.tiles)
    if args.worker:
        return worker()
    if args.profile:
        batches = tuple(int(b) for b in args.batches.split(","))
        return profile(args.profile.split(","), batches, args.repeats, args.json)
    if args.zero_shot:
        return zero_shot(args)
    # the local Hugging Face cache, set before huggingface_hub is imported (it reads them once)
    hf_home = args.work / "hf"
    shutil.rmtree(args.work, ignore_errors=True)
    hf_home.mkdir(parents=True)
    env = {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    os.environ.update(env)
    from tilestore.embed.models import list_models

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    names = args.models.split(",") if args.models else [s.name for s in list_models() if s.arch]
    sources = [p for p in (args.trident, args.conch, args.hibou, args.musk) if p]
    reference = Reference(args.reference_path, sources, env) if sources else None
    rows = []
    device = torch.cuda.get_device_name(0) if DEVICE == "cuda" else "CPU"
    args.json.parent.mkdir(parents=True, exist_ok=True)
    try:
        for name in names:
            row = run_one(name, args, reference, args.work)
            rows.append(row)
            print(_line(row), flush=True)
            args.json.write_text(  # after each encoder: kept if the run is cut off
                json.dumps({"device": device, "torch": torch.__version__, "rows": rows}, indent=2)
            )
    finally:
        if reference:
            reference.close()
    kind = "fp32" if args.precision == "fp32" else "each model's registered precision"
    print(f"\n{device}, {kind}, TF32 off; {args.tiles} tiles of CMU-1-Small-Region per encoder")
    print(
        "| encoder | family | pooling | dim | precision | reference | tiles at input size: "
        "cosine min / max abs diff | tiles at plan size |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(_md(row))
    print(f"json: {args.json}")


def zero_shot(args) -> None:
    """The zero-shot table: per encoder, its class embeddings (cosine, max |diff|) and
    tile probabilities (max |diff|, same top class) against the reference's."""
    args.work.mkdir(parents=True, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    rows = []
    for name in args.zero_shot.split(","):
        try:
            row = zero_shot_one(name, args, args.work)
        except Exception as exc:  # reported in the table, the others go on
            row = {"encoder": name, "error": f"{type(exc).__name__}: {exc}"[:300]}
        rows.append(row)
        print(_line(row), flush=True)
    device = torch.cuda.get_device_name(0) if DEVICE == "cuda" else "CPU"
    out = args.json.with_name("zeroshot.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"device": device, "torch": torch.__version__, "rows": rows}, indent=2)
    )
    print(
        f"\n{device}, fp32, TF32 off; CMU-1-Small-Region tiles, CONCH-style prompts, random weights"
    )
    print("| encoder | text tower | tiles | classes (prompts) | class embeddings: cosine min / "
          "max abs diff | tile probabilities: max abs diff | same top class |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['encoder']} | error: {r['error']} | | | | | |")
            continue
        print(f"| {r['encoder']} | {r['text']} | {r['tiles']} | {r['classes']} ({r['prompts']}) "
              f"| {_cell(r['class_embeddings'])} | {r['max_abs_prob_diff']:.1e} "
              f"| {r['same_top_class']:.0%} |")  # fmt: skip
    print(f"json: {out}")


def _line(row: dict) -> str:
    return f"{row['encoder']}: " + json.dumps({k: v for k, v in row.items() if k != "encoder"})


def _cell(cmp: dict | None) -> str:
    if not cmp:
        return "-"
    return f"{cmp['cosine_min']:.6f} / {cmp['max_abs_diff']:.1e}"


def _md(row: dict) -> str:
    head = (
        f"| {row['encoder']} | {row['family']} | {row['pooling']} | {row['dim']} "
        f"| {row.get('precision', 'fp32')} |"
    )
    if "error" in row:
        return f"{head} {row.get('reference', '')} | error: {row['error']} | |"
    if "why" in row:
        return f"{head} none: {row['why']} | | |"
    return (
        f"{head} {row['reference']} | {_cell(row.get('at_input'))} | {_cell(row.get('at_tile'))} |"
    )


if __name__ == "__main__":
    main()
