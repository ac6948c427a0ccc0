"""Viewer tile latency: our tile route against what a DeepZoom server does, in one process.

The 40,000 px SVS of real tissue (`make_slide.py`) and its copied store (`stores.py`). The
same 500 random level-0 tiles (240 px: Aperio's tiles, the store's chunks) are served:
  ours      - `tilestore.view.tiles.tile` (the bytes the server sends: the stored chunk);
  ours/http - the same through `tilestore view`'s app on uvicorn, one HTTP GET at a time on
              one kept-alive connection (as a browser's);
  openslide - OpenSlide's DeepZoomGenerator.get_tile of the same tile from the SVS, JPEG
              encoded by PIL at quality 75 (OpenSlide's deepzoom_server example), called
              and, as openslide/http, served the same way (a Starlette route on uvicorn).
Each tile is timed alone; the arms alternate tile by tile after 20 untimed warm-ups each,
so both see the same page cache. Prints p50/p95 per tile and the ratio; writes JSON.

    python bench/view.py --size 40000 --tiles 500
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import platform
import threading
import time
from pathlib import Path

import numpy as np
from stores import build

import tilestore
from tilestore.view import Catalog, bind, make_app
from tilestore.view.tiles import tile

HERE = Path(__file__).resolve().parent


def openslide_tile(generator, level: int, col: int, row: int) -> bytes:
    image = generator.get_tile(level, (col, row))
    out = io.BytesIO()
    image.save(out, "JPEG", quality=75)
    return out.getvalue()


def deepzoom_app(generator, level: int):
    """A DeepZoom tile server's route (OpenSlide's deepzoom_server example, in Starlette):
    the tile read from the slide and encoded per request."""
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    def dz_tile(request):
        col, row = int(request.path_params["col"]), int(request.path_params["row"])
        return Response(openslide_tile(generator, level, col, row), media_type="image/jpeg")

    return Starlette(routes=[Route("/dz/{col}/{row}", dz_tile)])


def serve_in_thread(app) -> tuple[str, object]:
    import uvicorn

    sock = bind("127.0.0.1", "auto")
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{sock.getsockname()[1]}", server


def percentiles(ms: list[float]) -> dict:
    a = np.asarray(ms)
    return {"p50_ms": float(np.percentile(a, 50)), "p95_ms": float(np.percentile(a, 95)),
            "mean_ms": float(a.mean()), "n": len(a)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", type=int, default=40_000)
    parser.add_argument("--tiles", type=int, default=500)
    parser.add_argument("--work", type=Path, default=HERE / "data")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "view.json")
    args = parser.parse_args()

    import openslide
    from openslide.deepzoom import DeepZoomGenerator

    source, store, _ = build(args.work, args.size, ())
    slide = tilestore.open_slide(store)
    reader = slide.chunks(0)
    rows, cols = reader.grid
    osr = openslide.OpenSlide(str(source))
    tile_px = reader.chunk_w
    generator = DeepZoomGenerator(osr, tile_size=tile_px, overlap=0, limit_bounds=False)
    dz_level = generator.level_count - 1  # full resolution
    assert generator.level_tiles[dz_level] == (cols, rows), (
        generator.level_tiles[dz_level],
        cols,
        rows,
    )
    rng = np.random.default_rng(0)
    pick_rows, pick_cols = rng.integers(0, rows, args.tiles), rng.integers(0, cols, args.tiles)
    picks = [(int(r), int(c)) for r, c in zip(pick_rows, pick_cols, strict=True)]
    warm = [
        (int(r), int(c))
        for r, c in zip(rng.integers(0, rows, 20), rng.integers(0, cols, 20), strict=True)
    ]
    url, server = serve_in_thread(make_app(Catalog([slide], [str(store)], [str(store)])))
    dz_url, dz_server = serve_in_thread(deepzoom_app(generator, dz_level))

    def ours(r, c):
        return tile(slide, 0, r, c).data

    def getter(base: str, route: str):
        connection = http.client.HTTPConnection(*base.removeprefix("http://").split(":"))

        def get(r, c):  # one kept-alive connection, as a browser keeps them
            connection.request("GET", route.format(r=r, c=c))
            response = connection.getresponse()
            if response.status != 200:
                raise RuntimeError(f"tile ({r}, {c}): HTTP {response.status}")
            return response.read()

        return get

    def theirs(r, c):
        return openslide_tile(generator, dz_level, c, r)

    arms = {
        "ours": ours,
        "openslide_deepzoom": theirs,
        "ours_http": getter(url, "/tiles/0/0/{c}/{r}"),
        "openslide_deepzoom_http": getter(dz_url, "/dz/{c}/{r}"),
    }
    for r, c in warm:
        for fn in arms.values():
            fn(r, c)
    times: dict[str, list[float]] = {k: [] for k in arms}
    sizes: dict[str, list[int]] = {k: [] for k in arms}
    for r, c in picks:
        for name, fn in arms.items():
            t0 = time.perf_counter()
            data = fn(r, c)
            times[name].append((time.perf_counter() - t0) * 1000)
            sizes[name].append(len(data))
    server.should_exit = dz_server.should_exit = True
    result = {
        "machine": {"python": platform.python_version(), "cpus": __import__("os").cpu_count()},
        "slide": {"size": args.size, "grid": [rows, cols], "tile_px": tile_px},
        "arms": {
            k: {**percentiles(v), "mean_bytes": float(np.mean(sizes[k]))} for k, v in times.items()
        },
    }
    for name, against in (("ours", "openslide_deepzoom"), ("ours_http", "openslide_deepzoom_http")):
        arm, base = result["arms"][name], result["arms"][against]
        arm["faster_p50"] = base["p50_ms"] / arm["p50_ms"]
        arm["faster_p95"] = base["p95_ms"] / arm["p95_ms"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"{args.tiles} random level-0 tiles of {tile_px} px, {args.size} px SVS and its store")
    print("| arm | p50 ms | p95 ms | mean KB | vs OpenSlide DeepZoom the same way (p50 / p95) |")
    print("|---|---|---|---|---|")
    for name, arm in result["arms"].items():
        ratio = (f"{arm['faster_p50']:.1f}x / {arm['faster_p95']:.1f}x faster"
                 if "faster_p50" in arm else "1")  # fmt: skip
        print(
            f"| {name} | {arm['p50_ms']:.3f} | {arm['p95_ms']:.3f} | "
            f"{arm['mean_bytes'] / 1024:.1f} | {ratio} |"
        )
    print(f"JSON: {args.out}")


if __name__ == "__main__":
    main()
