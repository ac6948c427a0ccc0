"""A run resolves its model once and its plan once per store, and passes the records along:
the command, the checks before the run, the engine and the Dask workers take the record,
never the name again (issue 64, item 3). The resolvers are wrapped with counters in every
module that holds them, so a call from anywhere counts."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from tilestore.embed import Options
from tilestore.embed.models import ModelSpec, get_model
from tilestore.plan import PlanOptions

REPO = Path(__file__).resolve().parents[2]
LITE = "efficientnet-lite0"

# `tilestore ARGV` in this process (tilestore.cli.main._main), the model's resolver
# (get_model) and the plan's (resolve_plan) wrapped with counters wherever a module holds
# them, now or once imported; prints the counts, the exit status and the plan of each call
DRIVER = r"""
import json, sys
import tilestore.cli.main
from tests.embed.test_resolved_once import counted
argv = json.loads(sys.stdin.read())
models = counted("tilestore.embed.models.registry", "get_model")
plans = counted("tilestore.plan.options", "resolve_plan")
sys.argv = ["tilestore", *argv]
code = 0
try:
    tilestore.cli.main._main()
except SystemExit as done:
    code = done.code or 0
print(json.dumps({"code": code, "models": [str(a[0]) for a in models],
                  "plans": [type(a[0]).__name__ for a in plans]}))
"""


def counted(module_name: str, name: str, put=setattr) -> list[tuple]:
    """Wrap `module_name.name` with a counter in that module and in every module loaded that
    holds the same function (a module imported later takes the wrapper from the source);
    return the list each call's arguments are appended to. put: how an attribute is set
    (a test's monkeypatch.setattr, undone after it)."""
    module = sys.modules.get(module_name) or __import__(module_name, fromlist=[name])
    original = getattr(module, name)
    calls: list[tuple] = []

    def wrapper(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    for held in list(sys.modules.values()):
        namespace = getattr(held, "__dict__", None)
        if namespace is None:
            continue
        for key, value in list(namespace.items()):
            if value is original:
                put(held, key, wrapper)
    return calls


def test_one_embed_command_over_two_stores_resolves_the_model_once_and_each_plan_once(
    store, tmp_path
):
    """Two stores, plan options given (a plan made per store): the model's name is
    resolved once in the process, the plan options once per store (the checks before the
    run resolve them; the run, tilestore.plan_slide and the plan layer take the record)."""
    a = store(into=tmp_path / "a")
    b = store(into=tmp_path / "b")
    argv = ["embed", a, b, "--model", LITE, "--device", "cpu", "--precision", "fp32",
            "--batch-size", "16", "--mpp", "1"]  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-c", DRIVER],
        input=json.dumps([str(x) for x in argv]),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    said = json.loads(run.stdout.strip().splitlines()[-1])
    assert said["code"] == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "22 tiles in" in run.stdout  # 11 tiles at 1 um/px in each store: both embedded
    assert said["models"] == [LITE]
    assert said["plans"] == ["PlanOptions", "PlanOptions"]  # one per store, none again


def test_embed_resolves_a_name_once_and_takes_a_record_as_it_is(store, tmp_path, monkeypatch):
    """The library's embed(): a name resolved once for the checks and the engine; a record
    passed in is never resolved again."""
    from tilestore.embed import embed

    calls = counted("tilestore.embed.models.registry", "get_model", monkeypatch.setattr)
    options = Options(batch_size=16, device="cpu", precision="fp32", dtype="float32")
    plan = PlanOptions(mpp=1, tile=224)
    a = store(into=tmp_path / "a")
    first = embed([a], LITE, plan=plan, options=options)
    assert first.tiles == 11 and calls == [(LITE,)]
    _one_scale_everywhere(a, first)
    spec = get_model(LITE)
    calls.clear()
    again = embed([store(into=tmp_path / "b")], spec, plan=plan, options=options)
    assert again.tiles == 11 and calls == []


def _one_scale_everywhere(store, report) -> None:
    """The scale of CMU's 1 um/px plan (level 1, 2x: 0.499 x 2 um/px, 224 px tiles) is one
    answer wherever it is asked: the plan's grid, the group's record the writer made, the
    tiles a slide encoder reads, the run's per-slide line."""
    from tilestore.embeddings import find_group
    from tilestore.embeddings.recipe import Scale, scale_of
    from tilestore.embeddings.slides import read_tile_features
    from tilestore.format.records import EmbeddingsRecord, read_record
    from tilestore.plan import load_plan
    from tilestore.reading.opening import open_slide

    slide = open_slide(store)
    expected = Scale(0.998, 224, 224)
    tile_plan, _ = load_plan(slide, "1mpp-224px")
    assert scale_of(tile_plan.spec) == expected
    path = find_group(store, LITE)
    record = read_record(slide.group[path], EmbeddingsRecord, path)
    assert scale_of(record.to_attrs()) == expected
    tiles = read_tile_features(store, LITE)
    assert (tiles.mpp, tiles.tile_size) == (0.998, 224)
    (line,) = report.slides
    assert (line["reading"]["mpp"], line["reading"]["tile"]) == (0.998, 224)


class _Registered(Exception):
    """Raised by the fake client once the cohort registers its model's plugin."""


class _Client:
    """What embed_cohort asks of a client up to its model's plugin: that plugin, kept."""

    def __init__(self) -> None:
        self.plugins: dict[str, object] = {}

    def register_plugin(self, plugin, name: str) -> None:
        self.plugins[name] = plugin
        raise _Registered


def test_a_dask_workers_plugin_carries_the_model_record_and_loads_it_without_the_name(
    store, tmp_path, monkeypatch
):
    """The plugin the cohort registers holds the coordinator's ModelSpec (not only its
    name); sent as Dask sends it (pickled) and set up as a worker does, it loads the model
    without a call of the name's resolver."""
    import cloudpickle

    from tilestore.embed import embed_cohort
    from tilestore.embed.daskworker import PLUGIN, EmbedderPlugin

    client = _Client()
    options = Options(batch_size=16, device="cpu", precision="fp32", dtype="float32")
    with pytest.raises(_Registered):
        embed_cohort([store(into=tmp_path)], LITE, client, options=options, say=None)
    plugin = client.plugins[PLUGIN]
    assert isinstance(plugin, EmbedderPlugin)
    assert isinstance(plugin.model, ModelSpec) and plugin.model == get_model(LITE)

    sent = pickle.loads(cloudpickle.dumps(plugin))  # as the scheduler hands it to a worker
    assert sent.model == plugin.model

    calls = counted("tilestore.embed.models.registry", "get_model", monkeypatch.setattr)
    embedder = sent._load()  # what the plugin's setup runs beside the worker's loop
    try:
        assert embedder.loaded.spec == plugin.model and embedder.loaded.output_dim == 1280
    finally:
        embedder.close()
    assert calls == []  # the name was not resolved on the "worker"


def test_the_checks_before_a_run_hand_each_store_its_resolved_plan(store, tmp_path):
    """check_stores keeps the plan options it resolved per store (the record the run
    takes); a stored plan named is loaded, not resolved, and so has none."""
    from tilestore.embed import check_stores
    from tilestore.plan import ResolvedPlan

    a = store(into=tmp_path / "a")
    spec = get_model(LITE)
    found = check_stores([a], spec, PlanOptions(mpp=1), Options(device="cpu"))
    resolved = found.plans[str(a)]
    assert isinstance(resolved, ResolvedPlan)
    assert (resolved.mpp, resolved.tile, resolved.name) == (1, 224, "1mpp-224px")
    assert found.tiles[str(a)] is None  # a plan the run makes: its tiles known then


def test_a_slide_encoders_plan_rule_is_the_librarys():
    """encoder_tiles: an encoder of a scale plans at it and refuses options asking another
    (one line, the option named); a pooling encoder takes the options as given."""
    from tilestore.embed.slides import encoder_tiles, get_slide_encoder
    from tilestore.errors import OptionError

    titan = get_slide_encoder("titan")
    conch = get_model("conch-v1.5")
    options = Options(device="cpu")
    plan, run = encoder_tiles(titan, conch, None, None, options)
    assert (plan.mpp, plan.tile) == (0.5, 512) and plan == PlanOptions(mpp=0.5, tile=512)
    assert run.any_scale is False  # conch-v1.5 reads 512 px at 0.5 um/px itself
    chief, run = encoder_tiles(
        get_slide_encoder("chief"), get_model("chief-ctranspath"), None, None, options
    )  # CHIEF's tiles: 256 px at 1 um/px, its CTransPath's own 224 px
    assert (chief.mpp, chief.tile, run.any_scale) == (1.0, 256, True)
    with pytest.raises(OptionError, match=r"^mpp=1: titan reads conch-v1.5 tiles of 512 px"):
        encoder_tiles(titan, conch, PlanOptions(mpp=1), None, options)
    with pytest.raises(OptionError, match=r"^plan=mine: titan reads"):
        encoder_tiles(titan, conch, None, "mine", options)
    mean = get_slide_encoder("mean")
    given = PlanOptions(mpp=1)
    assert encoder_tiles(mean, get_model(LITE), given, None, options) == (given, options)


def test_resolved_plan_options_are_the_options_with_five_decided(store):
    """ResolvedPlan has PlanOptions's fields; resolve_plan decides mpp, tile, stride,
    min_tissue and name and carries every other option as given (values written out)."""
    from dataclasses import fields

    from tilestore.masks.contrast import ContrastRule
    from tilestore.plan import ResolvedPlan, resolve_plan
    from tilestore.reading.opening import open_slide

    assert [f.name for f in fields(ResolvedPlan)] == [f.name for f in fields(PlanOptions)]
    rule = ContrastRule(max_min=120)
    given = PlanOptions(tissue_method="otsu", roi_class="tumour", min_roi=0.25, roi_mpp=0.25,
                        tolerance=0.1, max_artefact=0.2, exclude=("pen",), filter="contrast",
                        contrast=rule, upsample=True, max_blur=0.6, quality_from="uni")  # fmt: skip
    resolved = resolve_plan(given, open_slide(store()), native_mpp=1.0, native_tile=256)
    assert (resolved.mpp, resolved.tile, resolved.stride, resolved.min_tissue) == (1.0, 256, 256, 0)
    assert resolved.name.startswith("1mpp-256px-")
    carried = {"tissue_method": "otsu", "roi": None, "roi_class": "tumour", "min_roi": 0.25,
               "roi_mpp": 0.25, "tolerance": 0.1, "max_artefact": 0.2, "exclude": ("pen",),
               "filter": "contrast", "contrast": rule, "upsample": True, "max_blur": 0.6,
               "quality_from": "uni"}  # fmt: skip
    assert {name: getattr(resolved, name) for name in carried} == carried
