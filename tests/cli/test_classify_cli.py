"""`tilestore classify`: the prompts and the model refused at the door in one line, the
scores written and each slide's score printed; `models list` says which models do it."""

from __future__ import annotations

import json

from tests.cli.test_cli import tilestore as run
from tests.conftest import group_of
from tests.embed.test_zeroshot import PROMPTS, _embedded, _plip
from tilestore.plan import PlanOptions


def _file(tmp_path, content, name="tissue.json"):
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def test_a_bad_prompts_file_is_refused_before_any_store_is_read(tmp_path):
    bad = _file(tmp_path, {"classnames": {"tumor": ["a tumor"]}})
    done = run("classify", tmp_path / "absent.ome.zarr", "--model", "plip", "--prompts", bad)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"tilestore: error: --prompts {bad}: 'classnames' must map at least two classes "
        "to their names"
    )


def test_a_model_without_a_text_tower_is_one_line(tmp_path):
    done = run("classify", tmp_path / "a.ome.zarr", "--model", "uni", "--prompts",
               _file(tmp_path, PROMPTS))  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert done.stderr.startswith("tilestore: error: --model uni has no text tower")


def test_a_set_name_that_is_not_a_column_name_is_refused(tmp_path):
    done = run("classify", tmp_path / "a.ome.zarr", "--model", "plip", "--prompts",
               _file(tmp_path, PROMPTS), "--name", "two words")  # fmt: skip
    assert done.returncode == 2 and "--name" in done.stderr and "two words" in done.stderr


def test_a_tokenizer_file_for_a_model_whose_tokenizer_is_in_its_repo_is_refused(tmp_path):
    """PLIP reads its repo's tokenizer: a file given would be ignored and the scores would
    not be the file's, so it is refused at the door, before any store is read or model
    loaded (only CONCH v1 and MUSK take one)."""
    given = _file(tmp_path, "{}", name="my-tokenizer.json")
    done = run("classify", tmp_path / "absent.ome.zarr", "--model", "plip", "--prompts",
               _file(tmp_path, PROMPTS), "--tokenizer", given)  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.strip() == (
        f"tilestore: error: --tokenizer {given}: plip's tokenizer comes with its checkpoint; "
        "a tokenizer file is read only by the conch, musk text towers"
    )


def test_classify_writes_the_scores_and_prints_each_slides(store, tmp_path):
    folder = tmp_path / "plip"
    _plip(folder)
    path = store()
    _embedded(path, "plip", folder, PlanOptions(mpp="level0", tile=224), 224)
    done = run("classify", path, "--model", "plip", "--prompts", _file(tmp_path, PROMPTS),
               "--weights", folder, "--device", "cpu", "--name", "demo")  # fmt: skip
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert line.startswith(f"{path}: {group_of(path, 'plip')}/zeroshot/demo (") and "; top " in line
    assert "slide: tumor 0." in line


def test_features_of_other_weights_are_refused_in_one_line_naming_the_flags(store, tmp_path):
    """Features made with one checkpoint, a text tower read from another (both folders, no
    revision known): exit 2, one line, nothing written."""
    made, other = tmp_path / "plip", tmp_path / "plip-other"
    _plip(made)
    _plip(other, seed=9)
    path = store()
    _embedded(path, "plip", made, PlanOptions(mpp="level0", tile=224), 224)
    done = run("classify", path, "--model", "plip", "--prompts", _file(tmp_path, PROMPTS),
               "--weights", other, "--device", "cpu")  # fmt: skip
    assert done.returncode == 2, done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("tilestore: error:")]
    assert line == done.stderr.splitlines()[-1]  # above it: the model loading's progress
    assert line.startswith(f"tilestore: error: {path}: plip's features were made with weights of")
    assert "one checkpoint are needed; embed the store again with --model plip" in line
    assert line.endswith("(--weights <folder>)")
    assert not list((path / "embeddings" / "plip").rglob("zeroshot"))


def test_models_list_says_which_text_tower_scores_zero_shot():
    done = run("models", "list")
    assert done.returncode == 0
    want = {"plip": "clip", "conch-v1": "conch", "medsiglip": "siglip", "quiltnet-b32":
            "open_clip", "quiltnet-b16": "open_clip", "biomedclip": "open_clip", "omiclip":
            "open_clip", "keep": "keep", "musk": "musk", "uni": "-", "conch-v1.5": "-"}  # fmt: skip
    rows = {line.split()[0]: line.split()[-1] for line in done.stdout.splitlines() if line.split()}
    assert {name: rows.get(name) for name in want} == want
    assert "9 with a zero-shot text tower (" in done.stdout


def test_models_list_says_whose_code_builds_each_model():
    """The library that builds each model, or ours (the authors' construction written here):
    no model runs code from its weights' repository."""
    done = run("models", "list")
    assert done.returncode == 0
    want = {"uni": "timm", "dinov3-vits16": "timm", "efficientnet-lite0": "timm",
            "plip": "transformers", "hibou-b": "timm", "quiltnet-b32": "open_clip",
            "conch-v1": "tilestore", "musk": "tilestore", "keep": "tilestore",
            "genbio-pathfm": "tilestore"}  # fmt: skip
    header = next(line for line in done.stdout.splitlines() if line.startswith("name"))
    assert header.split()[:3] == ["name", "weights", "code"]
    rows = {
        words[0]: words[2]
        for words in map(str.split, done.stdout.splitlines())
        if words and words[0] in want and len(words) > 2
    }
    assert rows == want
