"""Our ABMIL, CLAM-SB and TransMIL equal the peers' own code with the same weights (fp32,
max abs difference < 1e-5): `bench/learn_reference.py` run on the peers' source files.

The peers' files are never in this repository: the test reads them from
$TILESTORE_LEARN_REFERENCES (or /tmp/learnref), laid out as the bench's docstring says, and
skips, saying why, where they are not there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
REFS = Path(os.environ.get("TILESTORE_LEARN_REFERENCES", "/tmp/learnref"))
NEEDED = (
    "TRIDENT/trident/slide_encoder_models/load.py",
    "TRIDENT/trident/slide_encoder_models/model_zoo/reusable_blocks/ABMIL.py",
    "CLAM/models/model_clam.py",
    "STAMP/src/stamp/modeling/models/trans_mil.py",
)


def _missing() -> str | None:
    absent = [n for n in NEEDED if not (REFS / n).is_file()]
    if absent:
        return f"no {REFS / absent[0]}: the peers' files, as bench/learn_reference.py says"
    code = "import sys; sys.path.insert(0, sys.argv[1]); import einops, beartype, jaxtyping"
    found = subprocess.run([sys.executable, "-c", code, str(REFS / "deps")], capture_output=True)
    if found.returncode:
        return f"the peers' dependencies (einops, beartype, jaxtyping) are not in {REFS / 'deps'}"
    return None


MISSING = _missing()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=str(MISSING))


def _bench(tmp_path: Path, *extra: str) -> tuple[int, dict]:
    out = tmp_path / "learn_reference.json"
    run = subprocess.run(
        [sys.executable, "bench/learn_reference.py", "--references", str(REFS),
         "--json", str(out), "--sizes", "1", "2", "17", "300", "--dim", "96", *extra],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    assert out.exists(), run.stderr
    return run.returncode, json.loads(out.read_text())


def test_our_models_equal_the_peers_with_the_same_weights(tmp_path):
    code, result = _bench(tmp_path)
    cases = {(r["model"], r["reference"]) for r in result["rows"]}
    assert cases == {
        ("abmil", "TRIDENT ABMILSlideEncoder"),
        ("abmil", "CLAM CLAM_SB"),
        ("clam-sb", "CLAM CLAM_SB"),
        ("clam-sb", "CLAM CLAM_SB, no gate"),
        ("clam-sb", "CLAM instance loss, no subtyping"),
        ("clam-sb", "CLAM instance loss, subtyping"),
        ("transmil", "STAMP TransMIL"),
    }
    # four sizes alone and one padded batch per case; the instance loss at 17 and 300 tiles
    assert len(result["rows"]) == 5 * 5 + 2 * 2
    for row in result["rows"]:
        assert row["logits"] < 1e-5, row
        assert row["attention"] is None or row["attention"] < 1e-5, row
        assert row["scale"] > 0.05, row  # logits of a size the difference is small against
    assert code == 0


def test_the_comparison_fails_where_the_weights_differ(tmp_path):
    code, result = _bench(tmp_path, "--nudge", "1e-3")
    assert code == 1
    nudged = [r for r in result["rows"] if "instance" not in r["reference"]]
    assert all(r["logits"] == pytest.approx(1e-3, rel=1e-2) for r in nudged)
