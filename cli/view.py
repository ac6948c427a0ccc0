"""`tilestore view`: a local, read-only web viewer of stores (and slides read in place)."""

from __future__ import annotations

import contextlib
import tempfile
import warnings
from pathlib import Path

import typer

from tilestore.cli.console import out
from tilestore.cli.flags import with_flags
from tilestore.options import store_read
from tilestore.reading import OverrideMpp, ScanMpp
from tilestore.view import HOST, PORT, Host, Port


@with_flags
def view(
    paths: list[str] = typer.Argument(
        ...,
        help="Stores, or tiled TIFF slides (read in place, their sidecars made in a "
        "temporary folder removed at the end).",
    ),
    scan_mpp: ScanMpp = None,
    override_mpp: OverrideMpp = False,
    port: Port = PORT,
    host: Host = HOST,
    roi: list[Path] | None = typer.Option(
        None,
        help="ROI annotations to draw (QuPath GeoJSON, Aperio or ASAP XML, level-0 px): "
        "once per slide, in the order of the slides.",
    ),
) -> None:
    """Pan and zoom the slides in a browser with their tissue, QC, plans and embeddings
    (PCA colours, clusters, per-tile columns, similarity to a clicked tile). Ctrl-C stops."""
    from tilestore import TilestoreError, open_slide
    from tilestore.conversion import open_in_place
    from tilestore.reading import in_scan_terms, sidecar_for
    from tilestore.view import Catalog, bind, make_app, serve

    with tempfile.TemporaryDirectory(prefix="tilestore-view-") as sidecars:
        slides, stores = [], []
        for path in map(store_read, paths):  # a store's URL kept whole, read where it is
            if isinstance(path, Path) and path.is_file():
                # the sidecar's conversion speaks of its mpp: this command's --scan-mpp
                with warnings.catch_warnings(record=True) as said:
                    warnings.simplefilter("always")
                    try:
                        slide = open_in_place(
                            path, sidecars, mpp=scan_mpp, override_mpp=override_mpp
                        )
                    except TilestoreError as exc:
                        raise type(exc)(in_scan_terms(str(exc))) from exc
                for warning in said:
                    warnings.warn(in_scan_terms(str(warning.message)), warning.category, 1)
                stores.append(str(sidecar_for(path, sidecars)))
            else:
                slide = open_slide(path)
                stores.append(str(path))
            slides.append(slide)
        catalog = Catalog(slides, [str(p) for p in paths], stores, roi or None)
        sock = bind(host, port)
        url = f"http://{host}:{sock.getsockname()[1]}/"
        names = ", ".join(s.name for s in slides[:3]) + (" ..." if len(slides) > 3 else "")
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how a viewer ends
            serve(
                make_app(catalog),
                sock,
                on_ready=lambda: out.print(
                    f"tilestore view: {url} ({len(slides)} slide(s): {names}); Ctrl-C stops",
                    highlight=False,
                    soft_wrap=True,  # the URL whole on its line, in a log too
                ),
            )
    out.print("tilestore view: stopped")
