"""Our MIL models against the peers' own code, with the same weights: the forward passes'
max abs difference (fp32), per model, reference and bag size. Prints a table, writes JSON.

The references are the peers' source files as their repositories hold them, imported by
file path from REFS (never copied into this repository), with their light dependencies
(einops; STAMP's beartype and jaxtyping) in REFS/deps:

    REFS/TRIDENT/trident/slide_encoder_models/load.py                      ABMILSlideEncoder
    REFS/TRIDENT/trident/slide_encoder_models/model_zoo/reusable_blocks/ABMIL.py
    REFS/CLAM/models/model_clam.py                                         CLAM_SB
    REFS/STAMP/src/stamp/modeling/models/trans_mil.py                      TransMIL
    REFS/<peer>/COMMIT                                                     the commit read

made with (the `fetch` tool's mirrors; any clone does):

    git --git-dir=MIRROR/mahmoodlab+TRIDENT/repo show HEAD:<path> > REFS/TRIDENT/<path>
    pip install --target REFS/deps einops beartype jaxtyping

Each reference is built with its own constructor, given seeded random weights (every
tensor drawn, so attention is far from uniform), and its state_dict is mapped onto ours by
the model module's `from_reference`. Each bag is compared alone (B=1), and all the bags at
once as one padded batch with a mask (ours) against each bag alone (theirs); CLAM-SB's
instance loss against CLAM's `instance_eval` (the "logits" column: the loss's difference).

    python bench/learn_reference.py --references /tmp/learnref [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import types
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from tilestore.learn.models import abmil, clam_sb, transmil

SEED = 0
DIM = 1024  # tile features, as UNI's or CONCH's
OUTPUTS = 3
SIZES = (1, 2, 17, 256, 1000, 4000)
STAMP_FILE = "STAMP/src/stamp/modeling/models/trans_mil.py"


@dataclass(frozen=True)
class Row:
    model: str
    reference: str
    bags: str  # "B=1, N=17" or "padded batch of 6"
    logits: float  # max abs difference
    attention: float | None
    scale: float  # max abs logit: what the difference is small against


def load_file(name: str, path: Path) -> types.ModuleType:
    """The module at `path`, imported under `name`."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_trident(root: Path) -> types.ModuleType:
    """TRIDENT's slide_encoder_models.load, its package stood up around the two files read
    (`trident.IO` only gives checkpoint paths, never asked for ABMIL: a stand-in)."""
    for package in (
        "trident",
        "trident.slide_encoder_models",
        "trident.slide_encoder_models.model_zoo",
        "trident.slide_encoder_models.model_zoo.reusable_blocks",
    ):
        sys.modules.setdefault(package, types.ModuleType(package))
    io = types.ModuleType("trident.IO")
    io.get_weights_path = io.get_dir = lambda *a, **k: None
    sys.modules["trident.IO"] = io
    blocks = root / "trident/slide_encoder_models/model_zoo/reusable_blocks"
    load_file("trident.slide_encoder_models.model_zoo.reusable_blocks.ABMIL", blocks / "ABMIL.py")
    return load_file(
        "trident.slide_encoder_models.load", root / "trident/slide_encoder_models/load.py"
    )


def randomise(module: nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Every parameter drawn (seeded): weights N(0, 1/fan_in), biases N(0, 0.1), layer
    norms' scales 1 + N(0, 0.1)."""
    generator = torch.Generator().manual_seed(seed)
    norms = {f"{n}.weight" for n, m in module.named_modules() if isinstance(m, nn.LayerNorm)}
    with torch.no_grad():
        for name, p in module.named_parameters():
            fan_in = p[0].numel() if p.dim() > 1 else 0
            std = fan_in**-0.5 if fan_in else 0.1
            p.copy_(torch.randn(p.shape, generator=generator) * std + (name in norms))
    return module.state_dict()


class TridentABMIL(nn.Module):
    """TRIDENT's ABMILSlideEncoder and a linear classifier, as its ABMIL tutorial builds
    them (the tutorial's head is an MLP; a linear one is what our ABMIL has)."""

    def __init__(self, load: types.ModuleType, dim: int, outputs: int) -> None:
        super().__init__()
        self.feature_encoder = load.ABMILSlideEncoder(
            freeze=False, input_feature_dim=dim, n_heads=1, head_dim=256, dropout=0.0, gated=True
        )
        self.classifier = nn.Linear(dim, outputs)

    def forward(self, x):
        z, raw = self.feature_encoder({"features": x}, device=x.device, return_raw_attention=True)
        return self.classifier(z), torch.softmax(raw[:, 0, 0, :], dim=-1)


@dataclass(frozen=True)
class Case:
    model: str
    reference: str
    build: Callable[[dict, int, int], nn.Module]  # the reference module
    run: Callable[
        [nn.Module, torch.Tensor], tuple
    ]  # (logits, attention | None) of one bag (1, N, D)
    ours: Callable[[dict], nn.Module]


def _clam(refs, dim, outputs):  # CLAM's defaults: gated, small (512, 256)
    return refs["clam"].CLAM_SB(gate=True, size_arg="small", n_classes=outputs, embed_dim=dim)


def _clam_run(module, x):
    logits, _, _, raw, _ = module(x[0])
    return logits, torch.softmax(raw, dim=-1)


CASES = (
    Case(
        "abmil",
        "TRIDENT ABMILSlideEncoder",
        lambda refs, dim, outputs: TridentABMIL(refs["trident"], dim, outputs),
        lambda module, x: module(x),
        lambda state: abmil.from_reference("trident", state),
    ),
    Case("abmil", "CLAM CLAM_SB", _clam, _clam_run, lambda s: abmil.from_reference("clam", s)),
    Case("clam-sb", "CLAM CLAM_SB", _clam, _clam_run, lambda s: clam_sb.from_reference("clam", s)),
    Case(
        "clam-sb",
        "CLAM CLAM_SB, no gate",
        lambda refs, dim, outputs: refs["clam"].CLAM_SB(
            gate=False, size_arg="big", dropout=0.25, n_classes=outputs, embed_dim=dim
        ),
        _clam_run,
        lambda s: clam_sb.from_reference("clam", s),
    ),
    Case(
        "transmil",
        "STAMP TransMIL",
        lambda refs, dim, outputs: refs["stamp"].TransMIL(outputs, dim, 512),
        lambda module, x: (module(x), None),
        lambda state: transmil.from_reference("stamp", state),
    ),
)


def load_references(root: Path) -> dict[str, types.ModuleType]:
    """The peers' modules from REFS (see the module)."""
    if (root / "deps").is_dir():
        sys.path.insert(0, str(root / "deps"))
    return {
        "trident": load_trident(root / "TRIDENT"),
        "clam": load_file("clam_model_clam", root / "CLAM/models/model_clam.py"),
        "stamp": load_file(
            "stamp_trans_mil", root / "STAMP/src/stamp/modeling/models/trans_mil.py"
        ),
    }


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def compare(refs: dict, sizes=SIZES, dim=DIM, outputs=OUTPUTS, nudge=0.0) -> list[Row]:
    """Every case at every bag size, alone and as one padded batch; `nudge` added to our
    head's bias after the mapping (a control: the comparison must then fail)."""
    rows = []
    for number, case in enumerate(CASES):
        reference = case.build(refs, dim, outputs).eval()
        ours = case.ours(randomise(reference, SEED + number)).eval()
        with torch.no_grad():
            ours.head.bias.add_(nudge)
        generator = torch.Generator().manual_seed(SEED)
        bags = [torch.randn(1, n, dim, generator=generator) for n in sizes]
        theirs = []
        with torch.no_grad():
            for x in bags:
                logits, attention = case.run(reference, x)
                got = ours(x)
                theirs.append(logits)
                rows.append(
                    Row(
                        case.model,
                        case.reference,
                        f"B=1, N={x.shape[1]}",
                        _diff(got.logits, logits),
                        None if attention is None else _diff(got.attention, attention),
                        float(logits.abs().max()),
                    )
                )
            # all bags in one batch, padded with garbage where a bag is shorter
            longest = max(sizes)
            batch = torch.randn(len(sizes), longest, dim, generator=generator) * 100
            mask = torch.zeros(len(sizes), longest, dtype=torch.bool)
            for b, x in enumerate(bags):
                batch[b, : x.shape[1]] = x[0]
                mask[b, : x.shape[1]] = True
            got = ours(batch, mask).logits
            expected = torch.cat(theirs)
        rows.append(
            Row(
                case.model,
                case.reference,
                f"padded batch of {len(sizes)}",
                _diff(got, expected),
                None,
                float(expected.abs().max()),
            )
        )
    return rows


def compare_instance_loss(refs: dict, sizes=SIZES, dim=DIM, outputs=OUTPUTS) -> list[Row]:
    """CLAM-SB's instance loss (k = 8 tiles each way) against CLAM's `instance_eval`, for
    each class as the bag's label, with and without subtyping; bags of 8 tiles or more."""
    rows = []
    for subtyping in (False, True):
        reference = _clam(refs, dim, outputs).eval()
        reference.subtyping = subtyping
        ours = clam_sb.from_reference("clam", randomise(reference, SEED)).eval()
        ours.subtyping = subtyping
        generator = torch.Generator().manual_seed(SEED)
        for n in (n for n in sizes if n >= reference.k_sample):
            x = torch.randn(1, n, dim, generator=generator)
            worst, scale = 0.0, 0.0
            with torch.no_grad():
                for label in range(outputs):
                    y = torch.tensor([label])
                    theirs = reference(x[0], label=y, instance_eval=True)[4]["instance_loss"]
                    worst = max(worst, _diff(ours.instance_loss(x, y), theirs))
                    scale = max(scale, float(theirs))
            kind = "subtyping" if subtyping else "no subtyping"
            rows.append(
                Row("clam-sb", f"CLAM instance loss, {kind}", f"B=1, N={n}", worst, None, scale)
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--references", type=Path, required=True, help="REFS (see the module)")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--dim", type=int, default=DIM)
    parser.add_argument("--nudge", type=float, default=0.0, help="a control: see compare")
    args = parser.parse_args(argv)
    torch.manual_seed(SEED)
    refs = load_references(args.references)
    rows = compare(refs, tuple(args.sizes), args.dim, nudge=args.nudge)
    rows += compare_instance_loss(refs, tuple(args.sizes), args.dim)
    print(f"{'model':9} {'reference':34} {'bags':20} {'logits':>9} {'attention':>9} {'|logit|':>8}")
    for r in rows:
        attention = "-" if r.attention is None else f"{r.attention:.1e}"
        print(
            f"{r.model:9} {r.reference:34} {r.bags:20} {r.logits:9.1e} {attention:>9} "
            f"{r.scale:8.2f}"
        )
    worst = max(r.logits for r in rows)
    print(f"worst logits difference: {worst:.2e} (target < 1e-5)")
    if args.json:
        commits = {
            peer: (args.references / peer / "COMMIT").read_text().strip()
            for peer in ("TRIDENT", "CLAM", "STAMP")
            if (args.references / peer / "COMMIT").exists()
        }
        out = {
            "torch": torch.__version__,
            "dtype": "float32",
            "device": "cpu",
            "dim": args.dim,
            "outputs": OUTPUTS,
            "commits": commits,
            "rows": [asdict(r) for r in rows],
            "worst": worst,
        }
        args.json.write_text(json.dumps(out, indent=1))
    return 0 if worst < 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
