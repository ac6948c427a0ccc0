"""The viewer's web server: a read-only Starlette app over a `Catalog`, run by uvicorn.

Every route is a GET that names slides, levels, chunks and tiles by number and models,
plans and columns by name, looked up in what the catalog holds: no route takes a path, so
nothing outside the stores given can be asked for; the page's own files are served from the
package by Starlette's `StaticFiles` (which refuses paths leaving its folder and links).

    /                                   the page (static/index.html)
    /api/slides                         the slides: size, levels, pixel size, layers
    /tiles/{slide}/{level}/{col}/{row}  a chunk as an image (`tilestore.view.tiles`)
    /api/overlay/{slide}?kind=...       an overlay's legend and extent, and its picture's URL
    /overlay/{slide}.png?kind=...       the picture (`tilestore.view.overlays`, `values`)
    /api/similar/{slide}?model&x&y&k    the tile under a point, its nearest tiles
    /thumb/{slide}.jpg?model&tile       one tile's pixels, small
"""

from __future__ import annotations

import errno
import json
import socket
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from tilestore.errors import TilestoreError, ViewError
from tilestore.options import checked
from tilestore.view.catalog import Catalog
from tilestore.view.options import HOST, PORT, Host, Port
from tilestore.view.overlays import (
    Overlay,
    plan_overlay,
    qc_overlay,
    roi_overlay,
    tissue_overlay,
)
from tilestore.view.tiles import encode, tile
from tilestore.view.values import columns, nearest, tile_at, tile_values

STATIC = __file__.rsplit("/", 1)[0] + "/static"
HEADERS = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}
OVERLAYS_KEPT = 32  # rendered overlays kept for their PNG request
THUMB = 128  # px of a gallery thumbnail


def make_app(catalog: Catalog) -> Starlette:
    """The viewer's ASGI app over these slides."""
    rendered: OrderedDict[str, Overlay] = OrderedDict()
    lock = threading.Lock()

    def overlay(request: Request) -> tuple[str, Overlay]:
        sid = _int(request.path_params, "sid")
        params = {k: request.query_params[k] for k in sorted(request.query_params)}
        key = f"{sid}?{urlencode(params)}"
        with lock:
            if key in rendered:
                rendered.move_to_end(key)
                return key, rendered[key]
        made = make_overlay(catalog, sid, params)
        with lock:
            rendered[key] = made
            while len(rendered) > OVERLAYS_KEPT:
                rendered.popitem(last=False)
        return key, made

    def page(request: Request) -> Response:
        return FileResponse(f"{STATIC}/index.html", headers=HEADERS)

    def slides(request: Request) -> Response:
        return _json([describe(catalog, s.index) for s in catalog.served])

    def chunk(request: Request) -> Response:
        p = request.path_params
        served = catalog.get(_int(p, "sid"))
        found = tile(served.slide, _int(p, "level"), _int(p, "row"), _int(p, "col"))
        headers = {**HEADERS, "Cache-Control": "private, max-age=600"}
        return Response(found.data, media_type=found.media_type, headers=headers)

    def overlay_facts(request: Request) -> Response:
        key, made = overlay(request)
        sid, query = key.split("?", 1)
        return _json(
            {"url": f"/overlay/{sid}.png?{query}", "extent": made.extent, "legend": made.legend}
        )

    def overlay_png(request: Request) -> Response:
        _, made = overlay(request)
        return Response(made.png, media_type="image/png", headers=HEADERS)

    def similar(request: Request) -> Response:
        sid = _int(request.path_params, "sid")
        q = request.query_params
        model = _text(q, "model")
        ref = (
            _int(q, "tile")
            if "tile" in q
            else tile_at(catalog, model, sid, _float(q, "x"), _float(q, "y"))
        )
        within = sid if q.get("scope") == "slide" else None
        hits = nearest(catalog, model, ref, min(_int(q, "k", 12), 100), within)
        return _json(
            {
                "ref": _tile_facts(catalog, model, ref),
                "hits": [{**_tile_facts(catalog, model, t), "score": s} for t, _, s in hits],
            }
        )

    def thumb(request: Request) -> Response:
        q = request.query_params
        model, ref = _text(q, "model"), _int(q, "tile")
        pixels = tile_pixels(catalog, model, ref)
        data = encode(_shrink(pixels, THUMB), quality=85)
        return Response(data, media_type="image/jpeg", headers=HEADERS)

    def models(request: Request) -> Response:
        model = _text(request.query_params, "model")
        return _json({"model": model, "columns": columns(catalog, model)})

    routes = [
        Route("/", page),
        Route("/api/slides", slides),
        Route("/api/columns", models),
        Route("/tiles/{sid}/{level}/{col}/{row}", chunk),
        Route("/api/overlay/{sid}", overlay_facts),
        Route("/overlay/{sid}.png", overlay_png),
        Route("/api/similar/{sid}", similar),
        Route("/thumb/{sid}.jpg", thumb),
        Mount("/static", StaticFiles(directory=STATIC, follow_symlink=False)),
    ]
    return Starlette(
        routes=routes,
        exception_handlers={TilestoreError: _error, ValueError: _bad_request},
    )


def make_overlay(catalog: Catalog, sid: int, params: dict[str, str]) -> Overlay:
    """The overlay `params` ask for (kind: tissue, qc, plan with plan=, or tiles with model=,
    column= and, as the column needs, k= or ref=)."""
    served = catalog.get(sid)
    kind = params.get("kind")
    if kind == "tissue":
        return tissue_overlay(served.slide)
    if kind == "qc":
        return qc_overlay(served.slide)
    if kind == "roi":
        if served.roi is None:
            raise ViewError(f"{served.slide.name}: no ROI file given (tilestore view --roi)")
        return roi_overlay(served.slide, served.roi)
    if kind == "plan":
        from tilestore.plan import load_plan

        return plan_overlay(served.slide, load_plan(served.slide, _text(params, "plan"))[0])
    if kind == "tiles":
        values = tile_values(
            catalog,
            _text(params, "model"),
            sid,
            _text(params, "column"),
            k=_int(params, "k", 6),
            ref=_int(params, "ref") if "ref" in params else None,
        )
        return values.overlay()
    raise ViewError(f"no overlay kind {kind!r} (tissue, qc, roi, plan, tiles)")


def describe(catalog: Catalog, sid: int) -> dict[str, Any]:
    """A slide's facts for the page: size, levels, pixel size, and what can be drawn on it."""
    from tilestore.plan import list_plans

    served = catalog.get(sid)
    slide = served.slide
    labels = _labels(slide)
    source = slide.record.source.facts
    return {
        "id": sid,
        "name": slide.name,
        "path": served.path,
        "width": slide.shape[2],
        "height": slide.shape[1],
        "channels": slide.shape[0],
        "mpp": list(slide.mpp) if slide.mpp else None,
        "levels": [
            {
                "width": lv.width,
                "height": lv.height,
                "downsample": list(lv.downsample),
                "tile": list(lv.chunks[1:]),
            }
            for lv in slide.levels
        ],
        "facts": {
            "format": source.get("format"),
            "vendor": source.get("vendor"),
            "objective": (slide.record.get("objective_power") or {}).get("value")
            or source.get("magnification"),
            "in place": bool(slide.record.source.in_place),
            "qc": slide.group.attrs.get("qc"),  # QC's own summary (`tilestore.qc.store`)
        },
        "layers": {
            "tissue": "tissue" in labels,
            "qc": "qc" in labels,
            "roi": served.roi is not None,
            "plans": list_plans(slide),
            "models": {name: _run_facts(facts) for name, facts in catalog.models(sid).items()},
        },
    }


def _run_facts(facts: dict[str, Any]) -> dict[str, Any]:
    model = facts.get("model") or {}
    return {
        "dim": model.get("output_dim"),
        "pooling": model.get("pooling"),
        "weights": model.get("repo") or model.get("weights"),
        "precision": facts.get("precision"),
        "plan": (facts.get("plan") or {}).get("name"),
        "tiles": facts.get("tiles"),
        "finished": facts.get("finished"),
        "mpp": facts.get("mpp"),
        "tile_size": facts.get("tile_size"),
    }


def _labels(slide) -> set[str]:
    try:
        return {name for name, _ in slide.group["labels"].groups()}
    except KeyError:
        return set()


def tile_pixels(catalog: Catalog, model: str, ref: int) -> np.ndarray:
    """One tile of the model's tiles as the model read it (its footprint, at its level)."""
    embedded = catalog.embedded(model)
    sid = embedded.slide_of(ref)
    meta = embedded.ds.attrs["slides"][embedded.slides.index(sid)]
    slide = catalog.get(sid).slide
    x, y = (int(embedded.ds[c][ref]) for c in ("x", "y"))
    level = int(meta.get("level") or 0)
    dy, dx = slide.levels[level].downsample
    fh, fw = meta["footprint0"]
    return slide.read_region(x, y, max(1, round(fw / dx)), max(1, round(fh / dy)), level=level)


def _tile_facts(catalog: Catalog, model: str, ref: int) -> dict[str, Any]:
    embedded = catalog.embedded(model)
    sid = embedded.slide_of(ref)
    meta = embedded.ds.attrs["slides"][embedded.slides.index(sid)]
    x, y = (int(embedded.ds[c][ref]) for c in ("x", "y"))
    return {
        "tile": ref,
        "slide": sid,
        "name": meta["name"],
        "x": x,
        "y": y,
        "size": list(meta["footprint0"]),
        "thumb": f"/thumb/{sid}.jpg?{urlencode({'model': model, 'tile': ref})}",
    }


def _shrink(pixels: np.ndarray, side: int) -> np.ndarray:
    from tilestore.reading.slide import resize

    h, w = pixels.shape[:2]
    scale = side / max(h, w)
    return (
        resize(pixels, max(1, round(w * scale)), max(1, round(h * scale))) if scale < 1 else pixels
    )


def _int(params, name: str, default: int | None = None) -> int:
    if name not in params:
        if default is None:
            raise ViewError(f"missing {name}")
        return default
    text = str(params[name])
    if not text.lstrip("-").isdigit() or len(text) > 12:
        raise ViewError(f"{name}={text!r} is not a whole number")
    return int(text)


def _float(params, name: str) -> float:
    try:
        value = float(params[name])
    except (KeyError, ValueError):
        raise ViewError(f"{name} must be a number") from None
    if not np.isfinite(value):
        raise ViewError(f"{name} must be finite")
    return value


def _text(params, name: str) -> str:
    value = params.get(name)
    if not value:
        raise ViewError(f"missing {name}")
    return str(value)


def _json(data: Any) -> Response:
    return Response(
        json.dumps(data, default=_plain), media_type="application/json", headers=HEADERS
    )


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON")


async def _error(request: Request, exc: Exception) -> Response:
    """Our errors as JSON naming the cause: 404 where what was asked for is not there (a
    slide, plan, model or column; embeddings absent or unfinished), 500 where it is there but
    cannot be read (a damaged store: a chunk, a document, embeddings whose shapes disagree or
    that hold NaN), 409 where results that must not meet were asked for together."""
    name = type(exc).__name__
    status = 404 if isinstance(exc, ViewError) or name in _NOT_FOUND else 500
    if name in _CONFLICT:  # results that must not be combined: said, not "not found"
        status = 409
    return JSONResponse({"error": str(exc).splitlines()[0]}, status, headers=HEADERS)


async def _bad_request(request: Request, exc: Exception) -> Response:
    return JSONResponse({"error": str(exc).splitlines()[0]}, 400, headers=HEADERS)


_NOT_FOUND = {"PlanError", "AnalysisError", "NotEmbedded"}
_CONFLICT = {"MixedResults"}


# -- running it -----------------------------------------------------------------------------


@checked
def bind(host: Host = HOST, port: Port = PORT) -> socket.socket:
    """A listening socket on (host, port) (port "auto": any free one); ViewError in one line
    where the port is taken or the address is not this machine's."""
    port = 0 if port == "auto" else port
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio turns Nagle's algorithm off only on sockets that say they
    # are TCP; with it on, every request after the first on a kept-alive connection waited
    # 40 ms for the client's delayed ACK (bench/RESULTS.md, viewer)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart right after a stop
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ViewError(f"port {port} on {host} is in use; choose another port") from None
        raise ViewError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(128)
    return sock


def serve(app: Starlette, sock: socket.socket, on_ready: Callable[[], None] | None = None) -> None:
    """Serve `app` on a socket from `bind` until interrupted (Ctrl-C: uvicorn finishes the
    requests in flight and returns)."""
    import uvicorn

    config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
    server = uvicorn.Server(config)
    if on_ready is not None:
        startup = server.startup

        async def announced(sockets=None):
            await startup(sockets=sockets)
            on_ready()

        server.startup = announced
    server.run(sockets=[sock])
