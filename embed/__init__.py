"""tilestore.embed: a streaming GPU embedder writing foundation-model features into tilestore
stores.

>>> from tilestore.embed import Options, embed
>>> report = embed(["stores/a.ome.zarr"], "uni", options=Options(compile=True))
>>> with Embedder("uni") as embedder:          # one model load for many runs
...     embedder.embed(stores_a); embedder.embed(stores_b)
>>> embed_cohort(stores, "uni", dask_client)   # many GPUs and nodes, through Dask
>>> embed_slides(stores, "titan")              # a slide vector from each store's tile features

Members load on first use: the decoder worker processes import this package and must not
pay for torch. May import `tilestore` (below it), never `tilestore.cli` (above it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tilestore.faces import lazy_face

__getattr__, __dir__, __all__ = lazy_face(
    __name__,
    {
        "tilestore.embed.cohort": (
            "CohortReport",
            "cpu_share",
            "embed_cohort",
            "local_cluster",
            "summary_lines",
        ),
        "tilestore.embed.compileahead": ("Compiled", "compile_ahead"),
        "tilestore.embed.dryrun": ("dry_run",),
        "tilestore.embed.engine": ("Embedder", "embed"),
        "tilestore.embed.inputs": ("Preparation", "SlidesAtOnce", "Stager"),
        "tilestore.embed.jobs": ("Slice",),
        "tilestore.embed.outcome": ("BAD_INPUT", "exit_code", "interrupted_code"),
        "tilestore.embed.preflight": ("Preflight", "check_stores", "scale_mismatch"),
        "tilestore.embed.prompts": ("Prompts", "read_prompts"),
        "tilestore.embed.models": (
            "LoadedModel",
            "ModelError",
            "get_model",
            "is_cached",
            "list_models",
            "load_model",
            "model_record",
            "pull",
        ),
        "tilestore.embed.report": ("RunReport", "format_report"),
        "tilestore.embed.reportfile": ("brief_report", "ended", "kept_said", "write_report"),
        "tilestore.embed.shares": ("shard",),
        "tilestore.stopping": ("TIME_LIMIT", "ask_stop", "kept_at_stop"),
        "tilestore.embed.settings": (
            "AUTO_CPU_DECODE_CPUS",
            "BATCHES",
            "REPEATS",
            "RESERVED_CPUS",
            "SLICE_TILES",
            "BatchSizes",
            "DecodeOption",
            "FeatureDtype",
            "Options",
            "PrecisionOption",
            "Repeats",
            "Settings",
            "Share",
            "SliceTiles",
            "parse_shard",
            "resolve",
        ),
        "tilestore.embed.sizing": ("plot_profile", "profile_model"),
        "tilestore.embed.slides": ("embed_slides", "get_slide_encoder", "list_slide_encoders"),
        "tilestore.embed.zeroshot": ("Classified", "ZeroShotOptions", "classify"),
    },
)

if TYPE_CHECKING:  # what type checkers and IDEs see
    from tilestore.embed.cohort import (
        CohortReport,
        cpu_share,
        embed_cohort,
        local_cluster,
        summary_lines,
    )
    from tilestore.embed.compileahead import Compiled, compile_ahead
    from tilestore.embed.dryrun import dry_run
    from tilestore.embed.engine import Embedder, embed
    from tilestore.embed.inputs import Stager
    from tilestore.embed.jobs import Slice
    from tilestore.embed.models import (
        LoadedModel,
        ModelError,
        get_model,
        is_cached,
        list_models,
        load_model,
        model_record,
        pull,
    )
    from tilestore.embed.outcome import BAD_INPUT, exit_code, interrupted_code
    from tilestore.embed.preflight import Preflight, check_stores, scale_mismatch
    from tilestore.embed.prompts import Prompts, read_prompts
    from tilestore.embed.report import RunReport, format_report
    from tilestore.embed.reportfile import brief_report, ended, kept_said, write_report
    from tilestore.embed.settings import (
        AUTO_CPU_DECODE_CPUS,
        BATCHES,
        REPEATS,
        RESERVED_CPUS,
        SLICE_TILES,
        BatchSizes,
        DecodeOption,
        FeatureDtype,
        Options,
        PrecisionOption,
        Repeats,
        Settings,
        Share,
        SliceTiles,
        parse_shard,
        resolve,
    )
    from tilestore.embed.shares import shard
    from tilestore.embed.sizing import plot_profile, profile_model
    from tilestore.embed.slides import embed_slides, get_slide_encoder, list_slide_encoders
    from tilestore.embed.zeroshot import Classified, ZeroShotOptions, classify
