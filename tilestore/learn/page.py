"""A run's one-page report (placeholder of learn-data's module)."""

from __future__ import annotations

import json
from pathlib import Path


def write_page(run_dir) -> Path:
    run_dir = Path(run_dir)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    lines = ["# Run", ""] + [f"- {k}: {v}" for k, v in metrics.get("pooled", {}).items()]
    page = run_dir / "report.md"
    page.write_text("\n".join(lines) + "\n")
    return page
