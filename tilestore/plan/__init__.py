"""Planning which tiles are read: pure tile geometry (`grid`, `coverage`), ROI annotations
(`annotations`), per-tile filters (`filters`), plans made, resolved and stored (`plans`),
and the order chunks are read in (`tiles`).

May import: `tilestore.qc` (stored QC maps only), `tilestore.masks`, `tilestore.reading`,
`tilestore.format`.
"""

from __future__ import annotations

from tilestore.faces import lazy_face

__getattr__, __dir__, __all__ = lazy_face(
    __name__,
    {
        "tilestore.plan.annotations": ("load_annotations",),
        "tilestore.plan.grid": ("GridSpec", "TilePlan"),
        "tilestore.plan.options": (
            "DEFAULT_MPP",
            "DEFAULT_TILE",
            "FILTERS",
            "MIN_TISSUE",
            "PlanOptions",
            "ResolvedPlan",
            "resolve_plan",
        ),
        "tilestore.plan.plans": (
            "list_plans",
            "load_plan",
            "plan_difference",
            "plan_grid",
            "plan_over_tissue",
            "plan_recipe",
            "plan_rois",
            "plan_slide",
            "plan_tissue",
            "plan_uid",
            "refuse_made_otherwise",
            "save_plan",
            "stored_record",
            "uses_stored_plan",
        ),
        "tilestore.plan.tiles": ("chunk_schedule", "cut_tile"),
    },
)
