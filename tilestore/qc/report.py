"""The cohort QC report: a table (CSV and Parquet, one row per slide) and one
self-contained HTML page (thumbnails inline, sortable columns, a flagged-only switch) to
scan a thousand slides in minutes.

Besides each slide's own flags, slides whose stain differs from the cohort's are flagged
``stain-cohort``: the slide's median haematoxylin or eosin more than COHORT_Z robust
spreads from the cohort's median (with at least COHORT_MIN slides to judge by).
"""

from __future__ import annotations

import base64
import html
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tilestore.qc.classes import ARTEFACTS
from tilestore.urls import written_here

if TYPE_CHECKING:
    from tilestore.qc.cohort import SlideQC

COHORT_Z = 3.5
COHORT_MIN = 5


def table(results: Sequence[SlideQC]):
    """The cohort as a pandas DataFrame, one row per slide (failed slides with their error)."""
    import pandas as pd

    rows = []
    for r in results:
        s = r.summary or {}
        row = {
            "slide": r.name,
            "store": r.store,
            "error": r.error or "",
            "judged": r.not_judged is None and r.error is None,
            "why_not_judged": r.not_judged or "",
            "tissue_mm2": s.get("tissue_mm2"),
            "tissue_fraction": s.get("tissue_fraction"),
        }
        row.update({f"{k}_fraction": v for k, v in (s.get("fractions") or {}).items()})
        stain = s.get("stain") or {}
        row.update({"h_median": stain.get("h_median"), "e_median": stain.get("e_median")})
        row.update({"od_median": stain.get("od_median"), "seconds": s.get("seconds")})
        row["flags"] = list(s.get("flags") or [])
        row["not_judged"] = " ".join(s.get("not_judged") or [])  # why: the store's QC notes
        rows.append(row)
    frame = pd.DataFrame(rows)
    ok = frame["judged"]
    for stain in ("h", "e"):
        values = frame.loc[ok, f"{stain}_median"].astype(float)
        median = values.median()
        scale = 1.4826 * (values - median).abs().median()
        frame[f"{stain}_cohort_z"] = (frame[f"{stain}_median"].astype(float) - median) / (
            scale if scale and scale > 0 else np.nan
        )
    if ok.sum() >= COHORT_MIN:
        odd = (frame["h_cohort_z"].abs() > COHORT_Z) | (frame["e_cohort_z"].abs() > COHORT_Z)
        for i in np.flatnonzero(odd & ok):
            frame.at[i, "flags"] = [*frame.at[i, "flags"], "stain-cohort"]
    frame["flags"] = frame["flags"].map(" ".join)
    return frame


def write_report(results: Sequence[SlideQC], folder: str | os.PathLike) -> dict[str, Path]:
    """Write qc.csv, qc.parquet and qc.html into folder; return their paths."""
    folder = written_here(folder, "folder")
    folder.mkdir(parents=True, exist_ok=True)
    frame = table(results)
    paths = {"csv": folder / "qc.csv", "parquet": folder / "qc.parquet", "html": folder / "qc.html"}
    frame.to_csv(paths["csv"], index=False)
    frame.to_parquet(paths["parquet"], index=False)
    paths["html"].write_text(_page(frame, results), encoding="utf-8")
    return paths


def _img(data: bytes) -> str:
    if not data:
        return ""
    return f'<img loading="lazy" src="data:image/jpeg;base64,{base64.b64encode(data).decode()}">'


def _page(frame, results: Sequence[SlideQC]) -> str:
    artefacts = [c.removesuffix("_fraction") for c in frame.columns if c.endswith("_fraction")]
    artefacts = [a for a in artefacts if a != "tissue"]
    heads = ["slide", "picture", "artefacts", "flags", "tissue mm²"]
    heads += [f"{a} %" for a in artefacts] + ["H", "E", "H z", "E z"]
    rows = []
    for (_, row), result in zip(frame.iterrows(), results, strict=True):
        flags = row["flags"].split() if row["flags"] else []
        if row["error"]:
            flags = ["error"]
        elif row["why_not_judged"]:
            flags = ["not judged"]
        badges = "".join(f'<span class="flag">{html.escape(f)}</span>' for f in flags)

        def num(value, scale=1.0, digits=2):
            if value is None or (isinstance(value, float) and np.isnan(value)):
                return '<td data-v="">–</td>'
            return f'<td data-v="{value * scale}">{value * scale:.{digits}f}</td>'

        cells = [
            f'<td data-v="{html.escape(row["slide"])}"><b>{html.escape(row["slide"])}</b>'
            f'<div class="err">{html.escape(row["error"] or row["why_not_judged"])}</div></td>',
            f"<td>{_img(result.thumbnail)}</td>",
            f"<td>{_img(result.overlay)}</td>",
            f'<td data-v="{len(flags)}">{badges}</td>',
            num(row["tissue_mm2"]),
            *(
                '<td data-v="">not judged</td>'
                if a in str(row.get("not_judged") or "").split()
                else num(row.get(f"{a}_fraction"), 100, 1)
                for a in artefacts
            ),
            num(row["h_median"], 1, 3),
            num(row["e_median"], 1, 3),
            num(row["h_cohort_z"], 1, 1),
            num(row["e_cohort_z"], 1, 1),
        ]
        rows.append(f'<tr class="{"flagged" if flags else ""}">{"".join(cells)}</tr>')
    legend = "".join(
        f'<span class="key" style="background:rgba{(*ARTEFACTS[a].rgba[:3], 0.8)}"></span>'
        f"{html.escape(a)}: {html.escape(ARTEFACTS[a].what)} "
        for a in artefacts
        if a in ARTEFACTS
    )
    flagged = sum(1 for r in rows if 'class="flagged"' in r)
    header = "".join(f'<th data-col="{i}">{html.escape(h)}</th>' for i, h in enumerate(heads))
    return _TEMPLATE.format(
        count=len(rows),
        flagged=flagged,
        legend=legend,
        header=header,
        rows="\n".join(rows),
        data=html.escape(json.dumps({"artefacts": artefacts})),
    )


_TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>tilestore QC: {count} slides</title>
<style>
body {{ font: 14px system-ui, sans-serif; margin: 16px; color: #222; }}
table {{ border-collapse: collapse; }}
th {{ position: sticky; top: 0; background: #eee; cursor: pointer; padding: 6px; }}
th:hover {{ background: #ddd; }}
td {{ border-top: 1px solid #ddd; padding: 4px 6px; vertical-align: top; text-align: right; }}
td:nth-child(-n+4) {{ text-align: left; }}
img {{ max-width: 200px; max-height: 200px; display: block; }}
tr.flagged {{ background: #fff4f0; }}
.flag {{ background: #c33; color: white; border-radius: 3px; padding: 1px 5px; margin: 1px;
  display: inline-block; font-size: 12px; }}
.err {{ color: #c33; max-width: 220px; font-size: 12px; }}
.key {{ display: inline-block; width: 12px; height: 12px; margin: 0 4px 0 12px; }}
</style></head><body data-report="{data}">
<h1>tilestore QC: {count} slides, {flagged} flagged</h1>
<p>{legend}</p>
<p><label><input type="checkbox" id="only"> flagged only</label>
 &nbsp; <input id="find" placeholder="filter by name"> &nbsp; click a column to sort</p>
<table id="qc"><thead><tr>{header}</tr></thead><tbody>
{rows}
</tbody></table>
<script>
const body = document.querySelector("#qc tbody");
let last = null, up = true;
document.querySelectorAll("th").forEach(th => th.onclick = () => {{
  const col = +th.dataset.col; up = last === col ? !up : false; last = col;
  const rows = [...body.rows].sort((a, b) => {{
    const x = a.cells[col].dataset.v ?? "", y = b.cells[col].dataset.v ?? "";
    const nx = parseFloat(x), ny = parseFloat(y);
    const c = isNaN(nx) || isNaN(ny) ? x.localeCompare(y) : nx - ny;
    return up ? c : -c;
  }});
  rows.forEach(r => body.appendChild(r));
}});
function show() {{
  const only = document.getElementById("only").checked;
  const text = document.getElementById("find").value.toLowerCase();
  for (const r of body.rows) {{
    const name = r.cells[0].dataset.v.toLowerCase();
    r.hidden = (only && !r.classList.contains("flagged")) || !name.includes(text);
  }}
}}
document.getElementById("only").onchange = show;
document.getElementById("find").oninput = show;
</script></body></html>
"""
