"""The models of `tilestore.learn.models`: the registry, shapes, masks (padding never
changes a result), attention, permutation invariance where it holds, and what each model's
tile scores are."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tilestore.errors import OptionError
from tilestore.learn.models import MODELS, abmil, clam_sb, make_model, transmil
from tilestore.learn.models.abmil import ABMIL
from tilestore.learn.models.base import gradient_x_input, masked_mean

D, OUT = 24, 3
BAGS = [n for n, s in MODELS.items() if s.bags]
INVARIANT = ["mean", "abmil", "clam-sb"]  # TransMIL sees the tiles' order by design


def _model(name: str, **hparams) -> torch.nn.Module:
    torch.manual_seed(0)
    small = {"transmil": {"hidden": 32}, "abmil": {"hidden": 16}, "clam-sb": {"hidden": 16}}
    model = make_model(name, D, OUT, **{**small.get(name, {}), **hparams}).eval()
    with torch.no_grad():  # biases drawn too: a bias of 0 would hide a missing "- b"
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def _bags(*lengths: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(1, n, D, generator=generator) for n in lengths]


def _padded(bags: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The bags as one batch, padded with garbage (huge values, NaN, inf)."""
    longest = max(b.shape[1] for b in bags)
    batch = torch.randn(len(bags), longest, D) * 1e4
    batch[:, :, 0] = float("nan")
    batch[:, :, 1] = float("inf")
    mask = torch.zeros(len(bags), longest, dtype=torch.bool)
    for i, bag in enumerate(bags):
        batch[i, : bag.shape[1]] = bag[0]
        mask[i, : bag.shape[1]] = True
    return batch, mask


def test_the_registry_names_five_models_and_imports_no_torch():
    assert list(MODELS) == ["mean", "abmil", "transmil", "clam-sb", "linear"]
    assert [n for n, s in MODELS.items() if s.attention] == ["abmil", "clam-sb"]
    assert [n for n, s in MODELS.items() if not s.bags] == ["linear"]
    code = "import sys, tilestore.learn.models, tilestore.learn; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_an_unknown_model_is_one_line_naming_the_known_ones():
    with pytest.raises(OptionError, match="model='abmill': not a model; known are mean, abmil"):
        make_model("abmill", D, OUT)


def test_an_unknown_hyper_parameter_is_refused_naming_those_the_model_takes():
    with pytest.raises(OptionError, match="'mean' takes no hidden: it takes dropout"):
        make_model("mean", D, OUT, hidden=3)


@pytest.mark.parametrize(
    ("name", "hparams", "said"),
    [
        ("abmil", {"dropout": 1.5}, "dropout=1.5: must be a number from 0 to 0.95"),
        ("abmil", {"activation": "tanh"}, "activation='tanh'"),
        ("transmil", {"hidden": 0}, "hidden=0"),
        ("clam-sb", {"k_sample": 0}, "k_sample=0"),
    ],
)
def test_a_hyper_parameter_out_of_its_range_is_refused(name, hparams, said):
    with pytest.raises(OptionError, match=said):
        make_model(name, D, OUT, **hparams)


def test_no_outputs_is_refused():
    with pytest.raises(OptionError, match="outputs=0"):
        make_model("abmil", D, 0)


@pytest.mark.parametrize("name", BAGS)
def test_shapes(name):
    model = _model(name)
    x = torch.randn(2, 7, D)
    out = model(x)
    assert out.logits.shape == (2, OUT)
    assert (out.attention is not None) == MODELS[name].attention
    if out.attention is not None:
        assert out.attention.shape == (2, 7)
    assert model.tile_scores(x).shape == (2, 7, OUT)


def test_the_vector_model_takes_vectors_or_a_patients_slides_vectors_averaged():
    model = _model("linear").eval()
    assert model(torch.randn(4, D)).logits.shape == (4, OUT)
    slides = torch.randn(2, 3, D)  # two patients' slide vectors, the second's third padding
    mask = torch.tensor([[True, True, True], [True, True, False]])
    slides[1, 2] = float("nan")
    got = model(slides, mask).logits
    want = model(torch.stack([slides[0].mean(0), slides[1, :2].mean(0)])).logits
    torch.testing.assert_close(got, want)
    with pytest.raises(ValueError, match=r"\(B, D\) or \(B, N, D\)"):
        model(torch.randn(4, 3, 2, D))


@pytest.mark.parametrize("name", BAGS)
def test_padding_never_changes_the_logits_attention_or_tile_scores(name):
    model = _model(name)
    bags = _bags(5, 9, 1, 9, 5)  # two lengths twice: TransMIL runs those bags together
    batch, mask = _padded(bags)
    with torch.no_grad():
        together = model(batch, mask)
        alone = [model(bag) for bag in bags]
    for i, (bag, out) in enumerate(zip(bags, alone, strict=True)):
        n = bag.shape[1]
        torch.testing.assert_close(together.logits[i], out.logits[0], atol=1e-6, rtol=0)
        if out.attention is not None:
            torch.testing.assert_close(
                together.attention[i, :n], out.attention[0], atol=1e-6, rtol=0
            )
            assert (together.attention[i, n:] == 0).all()
    scores = model.tile_scores(batch, mask)
    for i, bag in enumerate(bags):
        n = bag.shape[1]
        torch.testing.assert_close(scores[i, :n], model.tile_scores(bag)[0], atol=1e-6, rtol=0)
        assert (scores[i, n:] == 0).all()


@pytest.mark.parametrize("name", ["abmil", "clam-sb"])
def test_attention_sums_to_one_over_the_real_tiles(name):
    batch, mask = _padded(_bags(5, 9, 1))
    attention = _model(name)(batch, mask).attention
    torch.testing.assert_close(attention.sum(dim=1), torch.ones(3), atol=1e-6, rtol=0)
    assert (attention >= 0).all()


@pytest.mark.parametrize("name", INVARIANT)
def test_bag_models_are_permutation_invariant(name):
    model = _model(name)
    (bag,) = _bags(11)
    order = torch.randperm(11, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out, shuffled = model(bag), model(bag[:, order])
    torch.testing.assert_close(shuffled.logits, out.logits, atol=1e-6, rtol=0)
    if out.attention is not None:
        torch.testing.assert_close(shuffled.attention, out.attention[:, order], atol=1e-6, rtol=0)


def test_transmil_sees_the_order_of_tiles_and_each_bag_alone():
    """Not permutation invariant by design (PPEG's square, the landmarks); what holds: a
    bag's logits do not depend on the other bags of its batch."""
    model = _model("transmil")
    bags = _bags(11, 11)
    order = torch.randperm(11, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = model(bags[0]).logits
        assert (model(bags[0][:, order]).logits - out).abs().max() > 1e-4
        both = model(torch.cat(bags)).logits
    torch.testing.assert_close(both[0], out[0], atol=1e-6, rtol=0)


def test_mean_pool_tile_scores_average_to_the_logits_minus_the_bias():
    model = _model("mean")
    batch, mask = _padded(_bags(5, 9, 1))
    with torch.no_grad():
        logits = model(batch, mask).logits
        scores = model.tile_scores(batch, mask)
    mean = scores.sum(dim=1) / mask.sum(dim=1, keepdim=True)
    torch.testing.assert_close(mean, logits - model.head.bias, atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", ["abmil", "clam-sb"])
def test_attention_tile_scores_sum_to_the_logits_minus_the_bias(name):
    model = _model(name)
    batch, mask = _padded(_bags(5, 9, 1))
    with torch.no_grad():
        logits = model(batch, mask).logits
        scores = model.tile_scores(batch, mask)
    torch.testing.assert_close(scores.sum(dim=1), logits - model.head.bias, atol=1e-6, rtol=0)


def test_the_linear_heads_tile_scores_average_to_its_answer_on_the_mean_vector():
    model = _model("linear")
    (bag,) = _bags(6)
    with torch.no_grad():
        logits = model(bag.mean(dim=1)).logits
        scores = model.tile_scores(bag)
    torch.testing.assert_close(scores.mean(dim=1), logits - model.head.bias, atol=1e-6, rtol=0)


def test_gradient_x_input_of_a_linear_model_is_its_exact_share():
    """For mean-pool, d logit / d x_i = W / N: gradient x input is W x_i / N exactly."""
    model = _model("mean")
    batch, mask = _padded(_bags(5, 9))
    got = gradient_x_input(model, batch, mask)
    expected = model.tile_scores(batch, mask) / mask.sum(dim=1)[:, None, None]
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


def test_transmil_tile_scores_are_gradient_x_input():
    model = _model("transmil")
    (bag,) = _bags(7)
    x = bag.clone().requires_grad_(True)
    model(x).logits[0, 2].backward()
    expected = (x.grad * bag).sum(dim=-1)
    torch.testing.assert_close(model.tile_scores(bag)[..., 2], expected, atol=1e-6, rtol=0)


def test_abmil_gradients_match_finite_differences():
    torch.manual_seed(0)
    model = ABMIL(4, 2, hidden=5, attention_dim=3).double().eval()
    x = torch.randn(2, 3, 4, dtype=torch.double, requires_grad=True)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    assert torch.autograd.gradcheck(lambda x: model(x, mask).logits, (x,))


def test_clams_instance_loss_trains_the_instance_classifiers():
    model = _model("clam-sb", k_sample=4, subtyping=True)
    batch, mask = _padded(_bags(9, 2))
    loss = model.instance_loss(batch, torch.tensor([2, 0]), mask)
    assert loss.isfinite() and loss > 0
    loss.backward()
    assert all(c.weight.grad is not None and c.weight.grad.abs().sum() > 0 for c in model.instance)


def test_dropout_is_off_in_eval_and_on_in_train():
    model = _model("abmil", dropout=0.5)
    (bag,) = _bags(8)
    with torch.no_grad():
        assert torch.equal(model(bag).logits, model(bag).logits)
        model.train()
        assert not torch.equal(model(bag).logits, model(bag).logits)


def test_a_bf16_mean_of_many_tiles_is_divided_in_fp32():
    """3,024 of 9,074 tiles at 1: bf16 rounds the count and the sum (to 9,088 and 3,024),
    which gives 0.33203; summed and divided in fp32, the mean is bf16's 1/3 (0.33398)."""
    x = torch.zeros(1, 9_074, 2, dtype=torch.bfloat16)
    x[0, :3_024] = 1
    mean = masked_mean(x, torch.ones(1, 9_074, dtype=torch.bool))
    assert mean.dtype == torch.bfloat16
    assert torch.equal(mean, torch.full((1, 2), 3_024 / 9_074).to(torch.bfloat16))


@pytest.mark.parametrize("name", BAGS)
def test_a_bf16_model_on_bf16_bags_stays_close_to_fp32(name):
    model = _model(name)
    batch, mask = _padded(_bags(5, 9, 1))
    with torch.no_grad():
        expected = model(batch, mask).logits
        got = model.to(torch.bfloat16)(batch.to(torch.bfloat16), mask)
    assert got.logits.dtype == torch.bfloat16 and got.logits.isfinite().all()
    torch.testing.assert_close(got.logits.float(), expected, atol=3e-2, rtol=3e-2)


def test_a_reference_not_known_or_a_weight_without_a_counterpart_is_refused():
    with pytest.raises(ValueError, match="no ABMIL reference 'stamp': known are trident, clam"):
        abmil.from_reference("stamp", {})
    with pytest.raises(ValueError, match="no TransMIL reference 'clam'"):
        transmil.from_reference("clam", {})
    with pytest.raises(ValueError, match="not CLAM_SB's weights"):
        clam_sb.from_reference("clam", {"attention_net.0.weight": torch.zeros(2, 2)})
    state = make_model("clam-sb", 4, 2).state_dict()  # our names are not CLAM's
    with pytest.raises(ValueError, match=r"reference weight 'encoder\.0\.weight': no counterpart"):
        clam_sb.from_reference("clam", {**state, "attention_net.3.attention_a.0.weight": 0})


def test_stamps_names_map_onto_every_weight_of_ours():
    """Our TransMIL's weights, named as STAMP names them, come back whole (no peer code:
    the names inverted by hand from STAMP's module)."""
    model = _model("transmil")
    theirs = {
        "_fc1.": "fc1.", "pos_layer.proj.": "ppeg.conv7.", "pos_layer.proj1.": "ppeg.conv5.",
        "pos_layer.proj2.": "ppeg.conv3.", "_fc2.": "head.", "attn.to_qkv.": "attention.qkv.",
        "attn.to_out.0.": "attention.out.", "attn.res_conv.": "attention.residual.",
    }  # fmt: skip
    state = {}
    for key, value in model.state_dict().items():
        for stamp, ours in theirs.items():
            key = key.replace(ours, stamp)
        state[key] = value
    assert "layer1.attn.to_out.0.weight" in state and "pos_layer.proj1.bias" in state
    back = transmil.from_reference("stamp", state)
    for key, value in model.state_dict().items():
        assert torch.equal(back.state_dict()[key], value), key
