"""The reference side of `bench/slide_encoders.py`, run in its own process (the authors'
code wants einops, fairscale, OpenCV... that tilestore does not install).

For one encoder: build the authors' module from their code (local copies), draw random
weights (seeded), save them in the layout the authors publish, then compute the slide
vector from tilestore's H5 export the way TRIDENT does (`WSI.extract_slide_features`:
TRIDENT reads the H5's features, coords and attributes and calls its wrapper of the
authors' model), in fp32 on the CPU. Writes the vector (.npy) and the weights file.

    python bench/slide_references.py ENCODER H5 WEIGHTS OUT.npy --sources DIR --trident DIR
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import types
from argparse import Namespace
from pathlib import Path

import numpy as np
import torch
from torch import nn

SEED = 7


def randomise(module: nn.Module) -> dict[str, torch.Tensor]:
    """Seeded random weights in the module's own layout: layer norms' scales near 1, every
    other tensor N(0, 0.02); shared tensors stay shared (one draw)."""
    generator = torch.Generator().manual_seed(SEED)
    norms = {f"{n}.weight" for n, m in module.named_modules() if isinstance(m, nn.LayerNorm)}
    with torch.no_grad():
        for name, p in module.named_parameters():
            values = torch.randn(p.shape, generator=generator) * 0.02
            p.copy_(values + 1 if name in norms else values)
    return module.state_dict()


def flash_stand_in():
    """flash-attn's `flash_attn_func` (its forward: output and log-sum-exp), in torch's
    math: flash-attn is a CUDA kernel that neither this CPU nor an offline GPU machine can
    build. LongNet's dilated attention needs the log-sum-exp it returns."""

    def flash_attn_func(q, k, v, dropout=0.0, bias=None, softmax_scale=None, is_causal=False):
        assert bias is None and not is_causal and dropout == 0.0
        scale = softmax_scale or q.shape[-1] ** -0.5
        scores = torch.einsum("blhd,bshd->bhls", q.float(), k.float()) * scale
        lse = scores.logsumexp(dim=-1)  # (b, h, l)
        out = torch.einsum("bhls,bshd->blhd", torch.softmax(scores, -1), v.float())
        return out.to(q.dtype), lse

    return flash_attn_func


# where and in what precision the references run (set once by main from the command line)
RUN = {"device": "cpu", "precision": torch.float32}
PRECISIONS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def trident_vector(trident: Path, wrapper_name: str, model, h5: Path):
    """TRIDENT's slide-feature task on the H5: its wrapper class (forward only, the model
    given) and `WSI.extract_slide_features`, which reads the H5 as TRIDENT writes it (and
    moves the model to the device, autocasting unless fp32, as TRIDENT does)."""
    sys.path.insert(0, str(trident))
    from trident.slide_encoder_models import load
    from trident.wsi_objects.WSI import WSI

    cls = getattr(load, wrapper_name)
    wrapper = cls.__new__(cls)
    nn.Module.__init__(wrapper)
    wrapper.model, wrapper.precision, wrapper.enc_name = model, RUN["precision"], wrapper_name
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"trident-{os.getpid()}"
    path = WSI.extract_slide_features(
        types.SimpleNamespace(name=h5.stem), str(h5), wrapper, str(out), device=RUN["device"]
    )
    import h5py

    with h5py.File(path) as f:
        return np.asarray(f["features"][:], dtype=np.float32).reshape(-1)


def titan(src: Path, trident: Path, h5: Path, weights: Path) -> np.ndarray:
    sys.path.insert(0, str(src / "unicorn_baseline" / "src"))
    from unicorn_baseline.vision.pathology.titan.configuration_titan import TitanVisionConfig
    from unicorn_baseline.vision.pathology.titan.vision_transformer import build_vision_tower

    root = src / "unicorn_baseline/src/unicorn_baseline/vision/pathology/titan/config.json"
    config = json.loads(root.read_text())["vision_config"]
    tower = build_vision_tower(TitanVisionConfig(**config)).eval()
    state = randomise(tower)
    _save({f"vision_encoder.{k}": v for k, v in state.items()}, weights)

    class Titan(nn.Module):  # the Hub model's encode_slide_from_patch_features, one line
        def __init__(self):
            super().__init__()
            self.vision_encoder = tower

        def encode_slide_from_patch_features(self, features, coords, patch_size_lv0):
            return self.vision_encoder(features, coords, patch_size_lv0, no_proj=True)

    return trident_vector(trident, "TitanSlideEncoder", Titan().eval(), h5)


def prism(src: Path, trident: Path, h5: Path, weights: Path) -> np.ndarray:
    sys.path.insert(0, str(src / "unicorn_baseline" / "src"))
    if "environs" not in sys.modules:
        try:
            import environs  # noqa: F401
        except ImportError:  # its one use: a flag for xformers, off by default
            stand_in = types.ModuleType("environs")
            stand_in.Env = lambda: Namespace(bool=lambda name, default=False: default)
            sys.modules["environs"] = stand_in
    from unicorn_baseline.vision_language.prism.configuring_prism import PerceiverConfig
    from unicorn_baseline.vision_language.prism.perceiver import PerceiverResampler

    root = src / "unicorn_baseline/src/unicorn_baseline/vision_language/prism/config.json"
    config = json.loads(root.read_text())["perceiver_config"]
    resampler = PerceiverResampler(PerceiverConfig(**config)).eval()
    state = randomise(resampler)  # shared layers appear under each of their names
    _save({f"image_resampler.{k}": v.clone() for k, v in state.items()}, weights)

    class Prism(nn.Module):
        def __init__(self):
            super().__init__()
            self.image_resampler = resampler

        def slide_representations(self, tile_embeddings, tile_mask=None):
            return self.image_resampler(tile_embeddings, tile_mask=tile_mask)

    return trident_vector(trident, "PRISMSlideEncoder", Prism().eval(), h5)


def gigapath(src: Path, trident: Path, h5: Path, weights: Path, cls: bool = False) -> np.ndarray:
    root = src / "prov-gigapath"
    sys.path.insert(0, str(root))
    sys.path.insert(0, str(root / "gigapath"))  # its torchscale imports itself top-level
    flash = types.ModuleType("torchscale.component.flash_attention")
    flash.flash_attn_func = flash_stand_in()
    sys.modules["torchscale.component.flash_attention"] = flash
    import torchscale.architecture.config as config

    config.np = np  # numpy 2 prints np.int64(1024): its eval of the segment list needs np
    from gigapath import slide_encoder

    model = slide_encoder.create_model("", "gigapath_slide_enc12l768d", 1536, global_pool=not cls)
    model.eval()
    torch.save({"model": randomise(model)}, weights)
    if not cls:  # TRIDENT's: layer 11's hidden states, mean-pooled
        return trident_vector(trident, "GigaPathSlideEncoder", model, h5)
    import h5py  # the authors' pipeline: every layer's embedding; the last, class token

    device, dtype = RUN["device"], RUN["precision"]
    with h5py.File(h5) as f:
        features = torch.from_numpy(f["features"][:]).float()[None].to(device)
        coords = torch.from_numpy(f["coords"][:]).float()[None].to(device)
        model.tile_size = int(f["coords"].attrs["patch_size_level0"])
    autocast = torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32)
    with torch.no_grad(), autocast:
        out = model.to(device)(features, coords, all_layer_embed=True)[-1]
    return out.float().cpu().numpy().reshape(-1)


def madeleine(src: Path, trident: Path, h5: Path, weights: Path) -> np.ndarray:
    sys.path.insert(0, str(src / "MADELEINE"))
    from madeleine.models.Model import MADELEINE

    config = Namespace(
        MODALITIES=["HE", "IHC"],
        wsi_encoder="abmil",
        patch_embedding_dim=512,
        wsi_encoder_hidden_dim=512,
        activation="softmax",
        n_heads=4,
    )  # the released model's config (its model_config.json; mahmoodlab/MADELEINE's scripts)
    model = MADELEINE(config, stain_encoding=False).eval()
    torch.save(randomise(model), weights)
    return trident_vector(trident, "MadeleineSlideEncoder", model, h5)


def feather(src: Path, trident: Path, h5: Path, weights: Path, in_dim: int) -> np.ndarray:
    sys.path.insert(0, str(src / "MIL-Lab"))
    from src.models.abmil import ABMIL

    model = ABMIL(in_dim=in_dim, embed_dim=512, num_fc_layers=1, attn_dim=384, gate=True)
    model = model.eval()  # MIL-Lab's abmil/base.yaml: the FEATHER checkpoints' settings
    import safetensors.torch

    state = {f"model.{k}": v.contiguous() for k, v in randomise(model).items()}
    safetensors.torch.save_file(state, weights)
    return trident_vector(trident, FEATHER_WRAPPERS[in_dim], model, h5)


# TRIDENT's FEATHER wrapper by tile feature width; it has none for the UNI (v1) checkpoint:
# its conch_v15 one stands in (the wrappers differ only in the Hub repo they load; their
# forward is the same `model.forward_features`)
FEATHER_WRAPPERS = {768: "FeatherSlideEncoder", 1536: "FeatherUni2SlideEncoder",
                    1024: "FeatherSlideEncoder"}  # fmt: skip


def chief(src: Path, trident: Path, h5: Path, weights: Path) -> np.ndarray:
    root = src / "CHIEF"
    sys.path.insert(0, str(root))
    work = weights.parent / "chief-cwd"
    (work / "model_weight").mkdir(parents=True, exist_ok=True)
    # CHIEF's __init__ reads its 19 anatomic-site text embeddings from ./model_weight; they
    # feed the classifier's input only, not WSI_feature: random ones stand in
    torch.save(torch.randn(19, 768), work / "model_weight" / "Text_emdding.pth")
    here = Path.cwd()
    os.chdir(work)
    try:
        from models.CHIEF import CHIEF

        model = CHIEF(size_arg="small", dropout=True, n_classes=2).eval()
    finally:
        os.chdir(here)
    torch.save(randomise(model), weights)
    return trident_vector(trident, "CHIEFSlideEncoder", model, h5)


def moozy(src: Path, trident: Path, h5: Path, weights: Path) -> np.ndarray:
    """MOOZY's own pipeline (TRIDENT does not register it): its modules built as the released
    checkpoint's configs say, random weights saved as moozy.pt is laid out (both state dicts
    and their configs), loaded back by its `load_stage2_inference_model`; the slide read from
    the H5 by its `load_stage2_slide_sample` (its grid rebuilt from the coordinates) and
    encoded as its stage-2 model encodes each slide of a case. Also writes, beside OUT, the
    vector of a case of two slides (this one, and it with its features negated) as its
    `run_case_encoding` computes it: the patient check."""
    sys.path.insert(0, str(src / "MOOZY"))
    from moozy.data.stage2 import build_case_sample, collate_stage2_batch, load_stage2_slide_sample
    from moozy.models.case_transformer import CaseAggregator
    from moozy.models.factory import load_stage2_inference_model
    from moozy.models.moozy_slide_encoder import MOOZYSlideEncoder
    from moozy.models.serialization import (
        extract_case_transformer_config,
        extract_slide_encoder_config,
    )

    slide = MOOZYSlideEncoder(feat_dim=384, d_model=768, n_heads=12, n_layers=6,
                              dim_feedforward=3072, num_registers=4, dropout=0.1, qk_norm=False,
                              layerscale_init=0.0, learnable_alibi=False)  # fmt: skip
    case = CaseAggregator(d_model=768, num_layers=3, num_heads=12, dim_feedforward=3072,
                          dropout=0.1, layerscale_init=1e-5)  # fmt: skip
    payload = {
        "teacher_slide_encoder": randomise(slide.eval()),
        "slide_encoder_config": extract_slide_encoder_config(slide),
        "case_transformer": randomise(case.eval()),
        "case_transformer_config": extract_case_transformer_config(case),
    }
    torch.save(payload, weights)
    device, dtype = RUN["device"], RUN["precision"]
    model = load_stage2_inference_model(str(weights), device=torch.device(device))
    sample = load_stage2_slide_sample(h5.stem, str(h5), include_geometry_meta=True)
    negated = {**sample, "x": -sample["x"]}  # empty cells stay zero: still not tiles
    autocast = torch.autocast(device.split(":")[0], dtype=dtype, enabled=dtype != torch.float32)
    with torch.no_grad(), autocast:
        cls, _, _ = model.slide_encoder(
            sample["x"][None].to(device),
            invalid_mask=sample["invalid"][None].to(device),
            coords_xy=sample["coords"][None].to(device),
            patch_sizes=sample["patch_size"][None].to(device),
        )
        batch = collate_stage2_batch([build_case_sample(slides=[sample, negated])])
        patient = model(batch)["cls"]
    if "SLIDE_REFERENCE_OUT" in os.environ:  # not in --synthetic (speed) runs
        out = Path(os.environ["SLIDE_REFERENCE_OUT"])
        np.save(out.with_name(f"{out.stem}-patient.npy"), patient.float().cpu().numpy().ravel())
    return cls.float().cpu().numpy().reshape(-1)


def _reference_functions(path: Path, names: tuple[str, ...], namespace: dict) -> dict:
    """The named top-level functions of a source file, defined alone in `namespace` (their
    file's imports, CUDA or Triton, not run): mamba_ssm's and causal-conv1d's pure-PyTorch
    references beside their kernels."""
    import ast

    tree = ast.parse(path.read_text())
    found = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in names]
    assert {node.name for node in found} == set(names), (path, names)
    exec(compile(ast.Module(body=found, type_ignores=[]), str(path), "exec"), namespace)
    return namespace


def mamba_stand_in(root: Path) -> None:
    """mamba_ssm as COBRA imports it (``from mamba_ssm import Mamba2``): its own
    modules/mamba2.py, with its kernels replaced by its own reference implementations
    (mamba_ssm's CUDA and Triton kernels build on neither this CPU nor an offline GPU):

    - the fused path Mamba2 takes by default (use_mem_eff_path), ``mamba_split_conv1d_scan_
      combined``: its ``mamba_split_conv1d_scan_ref``, in which causal-conv1d's
      ``causal_conv1d_fn`` is causal-conv1d's ``causal_conv1d_ref``, the scan
      (``selective_scan_fn``) mamba_ssm's sequential ``selective_scan_ref`` and the gated
      norm (``rmsnorm_fn``) its ``rms_norm_ref``;
    - Mamba2's unfused path (use_mem_eff_path off: the layer's own conv1d and SiLU),
      ``mamba_chunk_scan_combined`` is its chunked ``ssd_chunk_scan_combined_ref``
      (chunk_state_ref, state_passing_ref, chunk_scan_ref), the sequence zero-padded at its
      end to whole chunks (which that reference asks for; a causal scan's earlier outputs do
      not see it) and cut back;
    - ``RMSNormGated``: its RMSNorm module's forward through ``rms_norm_ref``;
    - the tensor-parallel layers and collectives it imports, unused without a process
      group, are None; selective_state_update and causal_conv1d are absent (as Mamba2's own
      try/except allows)."""
    import importlib.util

    import torch.nn.functional as F
    from einops import rearrange, repeat

    conv = root.parent / "causal-conv1d" / "causal_conv1d" / "causal_conv1d_interface.py"
    base = {"torch": torch, "F": F, "rearrange": rearrange, "repeat": repeat}
    ops = root / "mamba_ssm" / "ops"
    refs = dict(base)
    _reference_functions(ops / "triton/layernorm_gated.py", ("rms_norm_ref",), refs)
    _reference_functions(ops / "selective_scan_interface.py", ("selective_scan_ref",), refs)
    _reference_functions(conv, ("causal_conv1d_ref",), refs)
    _reference_functions(ops / "triton/ssd_chunk_state.py", ("chunk_state_ref",), refs)
    _reference_functions(ops / "triton/ssd_state_passing.py", ("state_passing_ref",), refs)
    _reference_functions(ops / "triton/ssd_chunk_scan.py", ("chunk_scan_ref",), refs)
    refs["causal_conv1d_fn"] = refs["causal_conv1d_ref"]
    refs["selective_scan_fn"] = refs["selective_scan_ref"]
    refs["rmsnorm_fn"] = lambda x, weight, bias, z=None, eps=1e-6, group_size=None, \
        norm_before_gate=True: refs["rms_norm_ref"](x, weight, bias, z=z, eps=eps,
                                                    group_size=group_size,
                                                    norm_before_gate=norm_before_gate)  # fmt: skip
    _reference_functions(
        ops / "triton/ssd_combined.py",
        ("ssd_chunk_scan_combined_ref", "ssd_selective_scan", "mamba_split_conv1d_scan_ref"),
        refs,
    )
    sys.modules["mamba_ssm.ops.selective_scan_interface"] = types.SimpleNamespace(
        selective_scan_fn=refs["selective_scan_ref"]
    )  # where ssd_selective_scan imports selective_scan_fn from

    def chunk_scan(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, dt_softplus=False,
                   **unused):  # fmt: skip
        assert not unused.get("return_final_states") and unused.get("seq_idx") is None
        seqlen = x.shape[1]
        pad = -seqlen % chunk_size
        x, dt, B, C = (F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad)) for t in (x, dt, B, C))
        scan = refs["ssd_chunk_scan_combined_ref"]
        out = scan(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus)
        return out[:, :seqlen]

    def split_scan(zxbcdt, conv1d_weight, conv1d_bias, dt_bias, A, D, chunk_size, seq_idx=None,
                   **kwargs):  # fmt: skip
        assert seq_idx is None
        return refs["mamba_split_conv1d_scan_ref"](zxbcdt, conv1d_weight, conv1d_bias, dt_bias,
                                                   A, D, chunk_size, **kwargs)  # fmt: skip

    class RMSNormGated(nn.Module):  # mamba_ssm's RMSNorm module, its forward the reference
        def __init__(self, hidden_size, eps=1e-5, group_size=None, norm_before_gate=True,
                     device=None, dtype=None):  # fmt: skip
            super().__init__()
            self.eps, self.group_size, self.norm_before_gate = eps, group_size, norm_before_gate
            self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
            self.register_parameter("bias", None)

        def forward(self, x, z=None):
            return refs["rms_norm_ref"](x, self.weight, self.bias, z=z, eps=self.eps,
                                        group_size=self.group_size,
                                        norm_before_gate=self.norm_before_gate)  # fmt: skip

    def package(name: str, **attrs) -> types.ModuleType:
        module = types.ModuleType(name)
        module.__path__ = []  # a package: its submodules are those registered here
        module.__dict__.update(attrs)
        sys.modules[name] = module
        return module

    for name in ("mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.triton", "mamba_ssm.modules",
                 "mamba_ssm.distributed"):  # fmt: skip
        package(name)
    package("mamba_ssm.ops.triton.layernorm_gated", RMSNorm=RMSNormGated)
    package("mamba_ssm.ops.triton.ssd_combined", mamba_chunk_scan_combined=chunk_scan,
            mamba_split_conv1d_scan_combined=split_scan)  # fmt: skip
    package("mamba_ssm.distributed.tensor_parallel", ColumnParallelLinear=None,
            RowParallelLinear=None)  # fmt: skip
    package("mamba_ssm.distributed.distributed_utils", all_reduce=None, reduce_scatter=None)
    path = root / "mamba_ssm" / "modules" / "mamba2.py"
    spec = importlib.util.spec_from_file_location("mamba_ssm.modules.mamba2", path)
    mamba2 = importlib.util.module_from_spec(spec)
    sys.modules["mamba_ssm.modules.mamba2"] = mamba2
    spec.loader.exec_module(mamba2)
    sys.modules["mamba_ssm"].Mamba2 = mamba2.Mamba2


def cobra(src: Path, trident: Path, h5: Path, weights: Path) -> np.ndarray:
    """COBRA II as the authors load and run it: their MoCo model (cobra/ssl/model.py, the
    settings of get_cobraII and their example config, l_dim 256) with the random weights
    its own initialisation draws (seeded), saved
    as their pretraining saves it (``{"epoch", "state_dict"}``, DDP's ``module.`` before
    each name), loaded back by their ``get_cobraII`` (its momentum encoder) and run as
    STAMP's COBRA encoder runs it (``model(feats[None])``). Virchow2's features as STAMP
    makes them: the class token, the first 1280 of the H5's 2560. mamba_ssm stands in as
    `mamba_stand_in` says: the vector is Mamba2's default (fused) path's; beside OUT,
    ``-chunked.npy`` is its unfused path's (the chunked SSD reference). TRIDENT does not
    register COBRA."""
    mamba_stand_in(src / "mamba")
    sys.path.insert(0, str(src / "COBRA"))
    from cobra.ssl.model import MoCo
    from cobra.utils.load_cobra import get_cobraII

    cuda = nn.Module.cuda
    nn.Module.cuda = lambda self, *a, **k: self  # MoCo puts its predictor on a GPU
    torch.manual_seed(SEED)  # their own initialisation: N(0, 0.02) weights leave the
    try:  # attention all but uniform, and the Mamba layer's part in it small
        moco = MoCo(768, 256, input_dims=[512, 1024, 1280, 1536], num_heads=4,
                    nr_mamba_layers=1, dropout=0.2, att_dim=256, d_state=128)  # fmt: skip
    finally:
        nn.Module.cuda = cuda
    state = {f"module.{k}": v for k, v in moco.eval().state_dict().items()}
    torch.save({"epoch": 2000, "state_dict": state}, weights)
    model = get_cobraII(download_weights=False, checkpoint_path=str(weights)).eval()
    import h5py

    with h5py.File(h5) as f:
        feats = torch.from_numpy(f["features"][:]).float()
    if feats.shape[1] == 2560:
        feats = feats[:, :1280]
    device, dtype = RUN["device"], RUN["precision"]
    autocast = torch.autocast(device.split(":")[0], dtype=dtype, enabled=dtype != torch.float32)
    with torch.inference_mode(), autocast:
        out = model.to(device)(feats[None].to(device))
        for layer in model.modules():
            if type(layer).__name__ == "Mamba2":
                layer.use_mem_eff_path = False
        chunked = model(feats[None].to(device))
    if "SLIDE_REFERENCE_OUT" in os.environ:
        target = Path(os.environ["SLIDE_REFERENCE_OUT"])
        unfused = chunked.float().cpu().numpy().ravel()
        np.save(target.with_name(f"{target.stem}-chunked.npy"), unfused)
    return out.float().cpu().numpy().reshape(-1)


def mean(src: Path, trident: Path, h5: Path, weights: Path) -> np.ndarray:
    sys.path.insert(0, str(trident))
    from trident.slide_encoder_models.load import MeanSlideEncoder

    model = MeanSlideEncoder(model_name="mean-default")
    import h5py

    with h5py.File(h5) as f:
        batch = {"features": torch.from_numpy(f["features"][:])[None]}
    return model(batch, device=RUN["device"]).cpu().numpy().reshape(-1)


def maximum(src: Path, trident: Path, h5: Path, weights: Path) -> np.ndarray:
    import h5py

    with h5py.File(h5) as f:
        return np.asarray(f["features"][:], dtype=np.float32).max(axis=0)


REFERENCES = {
    "titan": titan,
    "prism": prism,
    "gigapath": gigapath,
    "gigapath-cls": lambda *a: gigapath(*a, cls=True),
    "madeleine": madeleine,
    "feather": lambda *a: feather(*a, in_dim=768),
    "feather-uni2": lambda *a: feather(*a, in_dim=1536),
    "feather-uni": lambda *a: feather(*a, in_dim=1024),
    "chief": chief,
    "moozy": moozy,
    "cobra": cobra,
    "cobra-conch": cobra,
    "cobra-uni": cobra,
    "cobra-h-optimus-0": cobra,
    "mean": mean,
    "max": maximum,
}


def _save(state: dict, path: Path) -> None:
    import safetensors.torch

    safetensors.torch.save_file({k: v.contiguous() for k, v in state.items()}, path)


def synthetic(
    encoder: str, tiles: int, sources: Path, trident: Path, weights: Path, limit_gb: float
) -> dict:
    """The authors' module on N random tiles of a square grid (coordinates in level-0 pixels
    of 512 px tiles), through TRIDENT's slide-feature task: seconds (building the module and
    saving its weights included) and peak memory: on the CPU the RSS above what the process
    held, under an address-space limit of `limit_gb` (beyond it: out of memory, not a killed
    machine); on a GPU, torch's peak allocation."""
    import resource
    import time

    import h5py

    side = int(np.ceil(np.sqrt(tiles)))
    dim = {"titan": 768, "gigapath": 1536, "gigapath-cls": 1536, "prism": 2560, "moozy": 384}[
        encoder
    ]
    step = 512
    h5 = weights.parent / f"synthetic-{encoder}-{tiles}.h5"
    cols, rows = np.arange(tiles) % side, np.arange(tiles) // side
    with h5py.File(h5, "w") as f:
        f["features"] = np.random.default_rng(0).standard_normal((tiles, dim), dtype=np.float32)
        f["coords"] = np.stack([cols * step, rows * step], 1).astype(np.int64)
        f["coords"].attrs["patch_size_level0"] = step
        f["coords"].attrs["patch_size"] = step  # MOOZY's reader asks for both
    cuda = RUN["device"].startswith("cuda")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if cuda:  # the card's own limit; its peak allocation is what is reported
        torch.cuda.reset_peak_memory_stats()
    else:
        limit = int(limit_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    started = time.perf_counter()
    try:
        REFERENCES[encoder](sources, trident, h5, weights)
        error = None
    except (MemoryError, RuntimeError) as exc:
        where = "on the GPU" if cuda else f"under {limit_gb:g} GB"
        error = f"out of memory {where} ({type(exc).__name__})"
    seconds = time.perf_counter() - started
    peak = (
        torch.cuda.max_memory_allocated() / 2**20
        if cuda
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before
    )
    return {"encoder": encoder, "tiles": tiles, "seconds": round(seconds, 2),
            "peak_mb": round(peak, 1), "error": error}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("encoder", choices=sorted(REFERENCES))
    parser.add_argument("h5", type=Path)
    parser.add_argument("weights", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--sources", type=Path, required=True, help="the authors' code")
    parser.add_argument("--trident", type=Path, required=True)
    parser.add_argument("--synthetic", type=int, help="measure on N random tiles instead")
    parser.add_argument("--limit-gb", type=float, default=16.0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", choices=sorted(PRECISIONS), default="fp32")
    args = parser.parse_args()
    RUN.update(device=args.device, precision=PRECISIONS[args.precision])
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if args.synthetic:
        with torch.no_grad():
            found = synthetic(args.encoder, args.synthetic, args.sources, args.trident,
                              args.weights, args.limit_gb)  # fmt: skip
        print(json.dumps(found))
        return
    os.environ["SLIDE_REFERENCE_OUT"] = str(args.out)  # where a patient check writes beside
    with torch.no_grad():
        vector = REFERENCES[args.encoder](args.sources, args.trident, args.h5, args.weights)
    np.save(args.out, np.asarray(vector, dtype=np.float32))


if __name__ == "__main__":
    main()
