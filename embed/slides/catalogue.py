"""The registered slide encoders and their facts, from their model cards and their authors'
code (each entry's ``card``); ``reference`` names what `bench/slide_encoders.py` checks ours
against. Tile model, um/px and tile size are what each was trained on (TRIDENT's table of
slide encoders says the same).

Not here: PRISM2 and CARE, whose architectures are published only as remote code inside
gated Hugging Face repositories (paige-ai/Prism2, Zipper-1/CARE), in no public repository
(bench/RESULTS.md, issue 50, says where it was looked for).
"""

from __future__ import annotations

from dataclasses import replace

from tilestore.embed.slides.spec import SlideSpec

NC_ND = "CC-BY-NC-ND-4.0"
HF = "https://huggingface.co/"

GIGAPATH = SlideSpec(
    "gigapath",
    "prov-gigapath",
    0.5,
    256,
    "grid",
    768,
    "longnet",
    {"in_dim": 1536, "layer": 11, "pool": "mean", "grid_size": 1000},
    repo="prov-gigapath/prov-gigapath",
    weights_file="slide_encoder.pth",
    gated=True,
    licence="Apache-2.0",
    precision="fp16",
    card=HF + "prov-gigapath/prov-gigapath",
    reference="trident:gigapath (prov-gigapath's LongNet)",
    note="as TRIDENT: layer 11 of 12, mean of the tiles; gigapath-cls: the authors' "
    "pipeline's last layer, class token",
)

# COBRA II (get_cobraII in KatherLab/COBRA's cobra/utils/load_cobra.py: its settings and
# file); it weighs the tiles of any of four tile models and returns their weighted mean, so
# its vector is that tile model's width. Their default tile model is Virchow2 (their
# extract_feats and example config) as STAMP embeds it: the class token alone, the first
# 1280 of tilestore's 2560 features. No um/px or tile size is checked: the authors
# pretrained on tiles at several magnifications (the paper's figure 1) and their scripts
# record 224 um (extract_feats) or 112 um (heatmaps) per 224 px tile. Its Mamba reads the
# tiles in order: ours in raster order (row by row), the order tile extractors (CLAM,
# TRIDENT, STAMP) write an H5 and COBRA's extract_feats reads one tile model's H5 in (it
# reorders only when two tile models' H5 files are matched).
COBRA = SlideSpec(
    "cobra",
    "virchow2",
    None,
    None,
    "none",
    1280,
    "cobra",
    {"in_dim": 2560, "width": 1280},
    repo="KatherLab/COBRA",
    weights_file="cobraII.pth.tar",
    gated=True,
    licence="GPL-3.0 (gated: non-commercial use)",
    precision="fp32",
    card=HF + "KatherLab/COBRA",
    reference="authors: KatherLab/COBRA Cobra (get_cobraII), mamba_ssm Mamba2 on its reference "
    "scan",
    note="COBRA II; Virchow2's class token (the first 1280 features), as STAMP embeds it; "
    "the slide vector is the tiles' attention-weighted mean, in the tile model's space",
)


def _cobra(name: str, tile_model: str, width: int) -> SlideSpec:
    """COBRA II on another of the tile models it has a head for (its vector: their width)."""
    return replace(
        COBRA,
        name=name,
        tile_model=tile_model,
        output_dim=width,
        kwargs={"in_dim": width},
        note="COBRA II; the slide vector is the tiles' attention-weighted mean, in the tile "
        "model's space",
    )


ENTRIES: tuple[SlideSpec, ...] = (
    SlideSpec(
        "mean",
        None,
        None,
        None,
        "none",
        None,
        "mean",
        source="none",
        licence="-",
        note="the mean of the tile features, for any tile model (TRIDENT's mean-<model>)",
        reference="trident:mean-<model> (MeanSlideEncoder)",
    ),
    SlideSpec(
        "max",
        None,
        None,
        None,
        "none",
        None,
        "max",
        source="none",
        licence="-",
        note="each feature's maximum over the tiles, for any tile model",
        reference="numpy max",
    ),
    SlideSpec(
        "titan",
        "conch-v1.5",
        0.5,
        512,
        "grid",
        768,
        "titan",
        {"in_dim": 768},
        repo="MahmoodLab/TITAN",
        weights_file="model.safetensors",
        gated=True,
        licence=NC_ND,
        precision="fp16",
        card=HF + "MahmoodLab/TITAN",
        reference="authors: MahmoodLab/TITAN vision tower (the Hub repo's code)",
    ),
    SlideSpec(
        "prism",
        "virchow",
        0.5,
        224,
        "none",
        1280,
        "prism",
        {"in_dim": 2560},
        repo="paige-ai/Prism",
        weights_file="model.safetensors",
        gated=True,
        licence=NC_ND,
        precision="fp16",
        card=HF + "paige-ai/Prism",
        reference="authors: paige-ai/Prism image resampler (the Hub repo's code)",
    ),
    GIGAPATH,
    replace(
        GIGAPATH,
        name="gigapath-cls",
        kwargs={**GIGAPATH.kwargs, "layer": 12, "pool": "cls"},
        reference="authors: prov-gigapath last_layer_embed",
        note="",
    ),
    SlideSpec(
        "chief",
        "chief-ctranspath",
        1.0,
        256,
        "none",
        768,
        "chief",
        {"in_dim": 768},
        source="file",
        weights_file="CHIEF_pretraining.pth",
        licence="AGPL-3.0",
        card="https://github.com/hms-dbmi/CHIEF",
        reference="authors: hms-dbmi/CHIEF models/CHIEF.py WSI_feature",
        note="weights from the authors' Google Drive (not on the Hub): pass --slide-weights",
    ),
    SlideSpec(
        "eagle",
        "virchow2-cls",
        2.0,
        224,
        "none",
        1280,
        "eagle",
        {"in_dim": 1280, "guide_dim": 768, "top": 25},
        source="file",
        weights_file="CHIEF_pretraining.pth",
        licence="GPL-3.0 (EAGLE); CHIEF's weights AGPL-3.0; Virchow2's features " + NC_ND,
        card="https://github.com/KatherLab/EAGLE",
        reference="authors: KatherLab/EAGLE eagle_features.py (CHIEF's attention_raw over "
        "CTransPath, top 25, the mean of Virchow2's class token), as STAMP's eagle",
        note="tiles at 2 um/px, 224 px, as EAGLE's README asks; CHIEF's weights from its "
        "authors' Google Drive: pass --slide-weights; the tiles chosen by chief-ctranspath "
        "features of the same plan (--model chief-ctranspath first; STAMP takes CHIEF's "
        "CTransPath or the original)",
        guide="chief-ctranspath",
        patients=True,
    ),
    SlideSpec(
        "madeleine",
        "conch-v1",
        1.0,
        256,
        "none",
        512,
        "madeleine",
        {"in_dim": 512},
        repo="MahmoodLab/madeleine",
        weights_file="model.pt",
        gated=True,
        licence=NC_ND,
        precision="bf16",
        card=HF + "MahmoodLab/madeleine",
        reference="trident:madeleine (mahmoodlab/MADELEINE encode_he)",
    ),
    SlideSpec(
        "feather",
        "conch-v1.5",
        0.5,
        512,
        "none",
        512,
        "feather",
        {"in_dim": 768},
        repo="MahmoodLab/abmil.base.conch_v15.pc108-24k",
        weights_file="model.safetensors",
        gated=True,
        licence=NC_ND,
        card=HF + "MahmoodLab/abmil.base.conch_v15.pc108-24k",
        reference="trident:feather (mahmoodlab/MIL-Lab ABMIL forward_features)",
    ),
    SlideSpec(
        "feather-uni2",
        "uni2-h",
        0.5,
        256,
        "none",
        512,
        "feather",
        {"in_dim": 1536},
        repo="MahmoodLab/abmil.base.uni_v2.pc108-24k",
        weights_file="model.safetensors",
        gated=True,
        licence=NC_ND,
        card=HF + "MahmoodLab/abmil.base.uni_v2.pc108-24k",
        reference="trident:feather_uni_v2 (mahmoodlab/MIL-Lab ABMIL forward_features)",
    ),
    SlideSpec(
        "feather-uni",
        "uni",
        0.5,
        256,
        "none",
        512,
        "feather",
        {"in_dim": 1024},
        repo="MahmoodLab/abmil.base.uni.pc108-24k",
        weights_file="model.safetensors",
        gated=True,
        licence=NC_ND,
        card=HF + "MahmoodLab/abmil.base.uni.pc108-24k",
        reference="authors: mahmoodlab/MIL-Lab ABMIL forward_features, abmil/base.yaml at "
        "in_dim 1024 (its ENCODER_DIM_MAPPING['uni']), through TRIDENT's feather wrapper",
        note="TRIDENT does not register it; 256 px tiles at 20x as FEATHER's other two and "
        "TRIDENT's uni_v1 extraction (uni's own plan default is 224 px)",
    ),
    SlideSpec(
        "moozy",
        "lunit-vits8",
        0.5,
        224,
        "grid",
        768,
        "moozy",
        {"in_dim": 384},
        repo="AtlasAnalyticsLab/MOOZY",
        weights_file="moozy.pt",
        licence="CC-BY-NC-SA-4.0",
        precision="fp32",
        card=HF + "AtlasAnalyticsLab/MOOZY",
        reference="authors: AtlasAnalyticsLab/MOOZY stage-2 model (load_stage2_inference_model)",
        note="also a patient's vector of its slides' (`tilestore patients`); the authors cap "
        "a slide's tiles by GPU memory (12,000 at 16 GB), this reads them all",
        patients=True,
    ),
    COBRA,
    _cobra("cobra-conch", "conch-v1", 512),
    _cobra("cobra-uni", "uni", 1024),
    _cobra("cobra-h-optimus-0", "h-optimus-0", 1536),
)
