"""`tilestore info` and `tilestore verify`: what a store or a slide holds, and whether it is
whole."""

from __future__ import annotations

import json
import sys

import typer

from tilestore.cli.console import AsJson, as_flags, human_size, out, text_table
from tilestore.cli.flags import From, with_flags
from tilestore.conversion import describe
from tilestore.options import Workers, store_read


def _gpu_jpeg(levels: list[dict]) -> str:
    """Whether `embed --decode gpu|both` can decode each level's chunks on the GPU."""
    known = [lv for lv in levels if "gpu_jpeg" in lv]
    refused = [f"level {lv['path']}: {lv['gpu_jpeg']}" for lv in known if lv["gpu_jpeg"]]
    if not known:
        return "unknown (the store is incomplete)"
    if not refused:
        return "every level (baseline colour JPEG: the JPEG engines of an A100 or H100 take it)"
    return "; ".join(refused) + " (decoded on the CPU instead)"


@with_flags
def info(
    path: str = typer.Argument(
        ..., help="A store (.ome.zarr), a slide file, or a slide's URL (s3://, https://)."
    ),
    as_json: AsJson = False,
    options: dict = From(describe, only=("verify",)),
) -> None:
    """Describe a store or a slide: levels, mpp, chunking, codec, size, completeness, and
    each model's embeddings (how far, slide vectors)."""
    from tilestore.embeddings import embeddings_status

    desc = describe(path, **options)
    if desc["kind"] == "store":
        desc["embeddings"] = [g.to_json() for g in embeddings_status(path).groups]
    if as_json:
        print(json.dumps(desc, indent=2))
        damaged = desc["kind"] == "slide" and desc["verified"]
        if damaged and any(lv["checked"]["bad"] for lv in desc["levels"]):
            raise typer.Exit(2)
        return
    mpp = desc["mpp"]
    mpp_text = (
        "unknown"
        if not mpp
        else (
            f"{mpp['x']:.4g} x {mpp['y']:.4g} µm/px ({mpp['origin']})"
            if "x" in mpp
            else f"{mpp['value'][0]:.4g} x {mpp['value'][1]:.4g} µm/px ({mpp['origin']})"
        )
    )
    if mpp and mpp.get("origin") == "override":  # the user's size over the file's
        stated = mpp.get("file")
        mpp_text = f"{mpp['x']:.4g} x {mpp['y']:.4g} µm/px, an OVERRIDE of " + (
            f"the file's {stated['x']:.4g} x {stated['y']:.4g} µm/px ({stated.get('origin')})"
            if stated
            else "none in the file"
        )
    out.print(f"[bold]{desc['path']}[/bold]  {desc['kind']}", highlight=False)
    out.print(f"mpp: {mpp_text}", highlight=False)
    if desc["kind"] == "store":
        state = "complete" if desc["complete"] else "[red]INCOMPLETE (interrupted)[/red]"
        if not desc["complete"]:
            print(
                f"tilestore: warning: {desc['path']}: INCOMPLETE: its conversion was interrupted "
                "or its attributes edited; convert the slide again with --overwrite",
                file=sys.stderr,
            )
        out.print(
            f"state: {state}; source {desc['source']['name']} ({desc['source']['format']}); "
            f"size {human_size(desc['size_bytes'])} = {desc['size_vs_source']}x source; "
            f"codec {desc['codec']['name']} ({desc['codec']['reason']})",
            highlight=False,
        )
        table = text_table(
            "level", "shape c,y,x", "chunk", "shard", "scale", "µm/px", "codecs", "path"
        )
        for lv in desc["levels"]:
            table.add_row(
                lv["path"],
                "x".join(map(str, lv["shape"])),
                "x".join(map(str, lv["chunks"][1:])),
                "x".join(map(str, lv["shards"][1:])) if lv.get("shards") else "-",
                f"1/{lv['downsample'][1]:.3g}",
                f"{lv['mpp'][0]:.4g}" if lv["mpp"] else "-",
                "+".join(lv["codecs"]),
                lv["write"],
            )
        if desc["tissue"]:
            out.print(
                f"tissue: {desc['tissue']['fraction']:.1%} ({desc['tissue']['method']}, "
                f"{desc['tissue']['polarity']})",
                highlight=False,
            )
        _print_channels(desc["channels"])
        for name, tiles in desc["plans"].items():
            out.print(f"plan {name}: {tiles} tiles", highlight=False)
        out.print(f"integrity: {_integrity(desc)}", highlight=False)
        out.print(f"GPU JPEG decoding: {_gpu_jpeg(desc['levels'])}", highlight=False)
    else:
        out.print(
            f"format {desc['format']} ({desc['vendor'] or 'generic'}), read by {desc['reader']}; "
            f"size {human_size(desc['size_bytes'])}; associated: "
            f"{', '.join(desc['associated']) or 'none'}",
            highlight=False,
        )
        out.print(
            f"pixels: {desc['pixels']}; convert would write {desc['codec']['name']} "
            f"({desc['codec']['reason']})",
            highlight=False,
        )
        _print_channels(desc["channels"])
        table = text_table(
            "level", "shape c,y,x", "dtype", "compression", "tile", "convert", "copyable"
        )
        for i, lv in enumerate(desc["levels"]):
            table.add_row(
                str(i),
                "x".join(map(str, lv["shape"])),
                lv["dtype"],
                lv["compression"],
                "x".join(map(str, lv["tile"])) if lv["tile"] else "strips",
                lv["write"],
                "yes" if lv["copyable"] else f"no: {lv['why_not']}",
            )
    out.print(table)
    if desc["kind"] == "store":
        for line in _embeddings(desc["embeddings"]):
            out.print(line, highlight=False)
    if desc["kind"] == "slide" and desc["verified"]:
        bad = [b for lv in desc["levels"] for b in lv["checked"]["bad"]]
        tried = sum(lv["checked"]["tiles"] for lv in desc["levels"])
        verdict = "all decode" if not bad else f"{len(bad)} do not decode: " + "; ".join(bad)
        out.print(f"tiles: {tried} sampled, {verdict}", highlight=False)
        if bad:  # damage found is the check's failure, as `verify` says of a store
            print(
                f"tilestore: error: {desc['path']}: {len(bad)} of {tried} sampled tiles do not "
                f"decode (first: {bad[0]})",
                file=sys.stderr,
            )
            raise typer.Exit(2)
    elif desc["kind"] == "slide":
        out.print("tiles: not read (metadata only; --verify decodes a sample)")


def _print_channels(channels: list[dict]) -> None:
    """One line: each channel's name, colour and display window where known."""
    if not channels:
        return
    parts = []
    for channel in channels:
        window = channel.get("window")
        shown = f" {window['start']:g}-{window['end']:g}" if window else ""
        color = f" #{channel['color']}" if channel.get("color") else ""
        parts.append(f"{channel['name']}{color}{shown}")
    out.print(f"channels: {'; '.join(parts)}", highlight=False)


def _embeddings(groups: list[dict]) -> list[str]:
    """A line per model's embeddings group: its state, tiles, plan, features, slide vectors."""
    if not groups:
        return ["embeddings: none (`tilestore embed`)"]
    lines = []
    for group in groups:
        line = f"embeddings {group['model']}: {group['state']}"
        if group["tiles"]:
            line += f", {group['tiles_done']:,} of {group['tiles']:,} tiles"
            line += f" of plan {group['plan']}, {group['dtype']} x {group['dim']}"
        if group["finished"]:
            line += f", finished {group['finished']}"
        vectors = [
            v["encoder"] + ("" if v["state"] == "current" else f" ({v['state']})")
            for v in group["slide_vectors"]
        ]
        if vectors:
            line += f"; slide vectors: {', '.join(vectors)}"
        if group["note"]:
            line += f" ({as_flags(group['note'], {'overwrite': ('--overwrite', None)})})"
        lines.append(line)
    return lines


def _integrity(desc: dict) -> str:
    """What a store's chunks are checked with (a sidecar's: also the slide's tiles)."""
    integrity = desc.get("integrity")
    if not integrity:
        text = "no checksums (a store from before they were kept): `tilestore verify --decode`"
    elif integrity.get("checksum"):
        text = f"every chunk written, each with its {integrity['checksum'].upper()}"
        if integrity.get("positions"):
            text += ", tied to its position (crc32c/<level>)"
        else:
            text += ", not tied to its position (made before position checks: `tilestore reshard`)"
    else:
        text = "every chunk written, no checksums"
    if desc.get("in_place_tiles"):
        text += f"; the slide's tiles {desc['in_place_tiles']}"
    return text + " (`tilestore verify` reads every chunk)"


@with_flags
def verify(
    stores: list[str] = typer.Argument(
        ..., help="Stores (.ome.zarr) to check: paths, or URLs (s3://, gs://, https://)."
    ),
    decode: bool = typer.Option(False, "--decode", help="Also decode every chunk (slower)."),
    workers: Workers = None,
) -> None:
    """Read every chunk of each store, check its checksum, list every bad one (exit 2 if any)."""
    from tilestore import ServerError, StoreError
    from tilestore.reading import verify_store

    bad = 0
    for store in map(store_read, stores):  # a URL kept whole
        try:
            result = verify_store(store, decode=decode, workers=workers)
        except (StoreError, ServerError) as exc:  # not opened or read: the next go on
            print(f"tilestore: error: {exc}", file=sys.stderr)
            bad += 1
            continue
        how = "read and decoded" if decode else "read"
        state = "all good" if result.ok else f"{len(result.bad)} BAD"
        if result.ok and result.unchecked and not decode:
            state = "nothing wrong where checksums exist (--decode checks the arrays without)"
        out.print(
            f"{result.store}: {result.chunks} chunks of {result.arrays} arrays {how} in "
            f"{result.seconds:.1f} s: {state}",
            highlight=False,
        )
        if result.unchecked:
            out.print(f"  without checksums: {', '.join(result.unchecked)}", highlight=False)
        if result.unsummed:
            out.print(
                f"  not checked by content (a sidecar made before tile checksums: each tile "
                f"read and decoded; remove the sidecar to make it again with them): levels "
                f"{', '.join(result.unsummed)}",
                highlight=False,
            )
        if result.untied:
            out.print(
                f"  not tied to their positions (made before position checks: `tilestore "
                f"reshard` or converting again adds them): levels {', '.join(result.untied)}",
                highlight=False,
            )
        if result.untied_groups:
            groups = ", ".join(result.untied_groups)
            out.print(f"  embeddings not compared with their positions: {groups}", highlight=False)
        for line in result.bad:
            print(f"tilestore: error: {line}", file=sys.stderr)
        bad += len(result.bad)
    if bad:
        raise typer.Exit(2)
