"""The registered slide encoders, by name (`tilestore.embed.slides.catalogue` holds their
facts); ``random:<name>`` is a registered encoder with random weights (benchmarks, sizing)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from tilestore.embed.slides.catalogue import ENTRIES
from tilestore.embed.slides.spec import SlideSpec
from tilestore.errors import OptionError, SlideEncoderError
from tilestore.plan.options import PlanOptions

if TYPE_CHECKING:
    from tilestore.embed.models.spec import ModelSpec
    from tilestore.embed.settings import Options

SLIDE_REGISTRY: dict[str, SlideSpec] = {spec.name: spec for spec in ENTRIES}


def get_slide_encoder(name: str) -> SlideSpec:
    """The spec of a registered slide encoder, or of ``random:<registered name>``."""
    if name in SLIDE_REGISTRY:
        return SLIDE_REGISTRY[name]
    if name.startswith("random:") and name.split(":", 1)[1] in SLIDE_REGISTRY:
        return replace(SLIDE_REGISTRY[name.split(":", 1)[1]], name=name, source="random")
    raise SlideEncoderError(
        f"unknown slide encoder {name!r}; choose one of {', '.join(SLIDE_REGISTRY)} or "
        "random:<name>"
    )


def list_slide_encoders() -> list[SlideSpec]:
    return list(SLIDE_REGISTRY.values())


def tile_model_for(spec: SlideSpec, model: str | None) -> str:
    """The tile model whose features the encoder reads: its own; `model` must agree."""
    if spec.tile_model is None:
        if model is None:
            raise SlideEncoderError(f"{spec.name} pools any tile model's features: name one")
        return model
    if model is not None and model not in spec.tile_models():
        raise SlideEncoderError(
            f"{spec.name} reads {spec.tile_model} tile features, not {model}: leave "
            f"--model out or give --model {spec.tile_model}"
        )
    return model or spec.tile_model


def encoder_tiles(
    spec: SlideSpec,
    model: ModelSpec,
    plan_options: PlanOptions | None,
    plan: str | None,
    options: Options,
) -> tuple[PlanOptions | None, Options]:
    """The plan options and run options that give a slide encoder its tiles: the one rule,
    the command's and the library's. An encoder that names a scale (`spec.mpp`, `spec.tile`)
    reads tiles planned at it: a stored plan (`plan`), or plan options asking another mpp
    or tile, are refused in one line; the options get its mpp and tile. Tiles it reads at
    another scale than its tile model's own (`model`, the run's record) are what it was
    trained on, so they are embedded (any_scale) and said so per slide. A pooling encoder
    (no scale) takes any plan: the options as given."""
    from tilestore.embed.preflight import scale_mismatch  # the checks: stores, not loaded here

    if spec.mpp is None:  # pooling: any tile model, any plan
        return plan_options, options
    if plan:  # a stored plan's tiles may be at any scale: the encoder's own are planned
        raise OptionError(
            f"plan={plan}: {spec.name} reads {spec.tile_model} tiles of {spec.tile} px at "
            f"{spec.mpp:g} um/px, planned for it; leave it out"
        )
    given = plan_options or PlanOptions()
    for name, asked, needed in (("mpp", given.mpp, spec.mpp), ("tile", given.tile, spec.tile)):
        if asked is not None and asked != needed:
            raise OptionError(
                f"{name}={_shown(asked)}: {spec.name} reads {spec.tile_model} tiles of "
                f"{spec.tile} px at {spec.mpp:g} um/px; leave it out"
            )
    if scale_mismatch(spec.mpp, spec.tile, model):
        options = replace(options, any_scale=True)
    return replace(given, mpp=spec.mpp, tile=spec.tile), options


def _shown(value) -> str:
    """An option's value as a user types it: 1 for 1.0, level0 as is."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def guides_missing(stores: list, spec: SlideSpec, plan_options: PlanOptions) -> None:
    """Before a slide encoder's tiles are embedded: OptionError in one line where a store
    given lacks finished features of the encoder's guide model (EAGLE: chief-ctranspath)
    on the plan its tiles come from (`encoder_tiles`' options), as the run reads them
    (`open_finished`): found after the tile run, that run's GPU time would be spent for
    nothing. A slide file or a URL (a store this run makes or finds) is judged at its own
    turn (`tilestore.embed.slides.run`)."""
    if spec.guide is None:
        return
    from tilestore.format.store import is_store
    from tilestore.plan.options import default_name

    options = plan_options
    name = options.name or default_name(
        options.mpp, options.tile, options.stride or options.tile, options
    )
    lacking = [(s, why) for s in stores if is_store(s) and (why := _missing(s, spec.guide, name))]
    if lacking:
        _, why = lacking[0]
        raise OptionError(
            f"{spec.name} is guided by {spec.guide} features of the same tiles (plan {name}): "
            f"{len(lacking)} of {len(stores)} store(s) lack them (first: {why}); embed them "
            f"with {guide_command(spec)} first"
        )


def guide_command(spec: SlideSpec) -> str:
    """The flags that embed an encoder's guide model on the tiles the encoder reads (at a
    scale other than the guide model's own: --any-scale)."""
    return f"--model {spec.guide} --mpp {spec.mpp:g} --tile {spec.tile} --any-scale"


def _missing(store, model: str, plan: str) -> str | None:
    """Why `store` holds no finished group of `model` on `plan`, as the reader says it
    (None: it holds one)."""
    from tilestore.embeddings.groups import open_finished
    from tilestore.errors import NotEmbedded, StoreError

    try:
        open_finished(store, model, plan)
    except (NotEmbedded, StoreError) as exc:
        return str(exc)
    return None
