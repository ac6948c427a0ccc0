"""Print tilestore's import graph as floors (grimp): each module's floor is one more than the
highest floor among the modules it imports (TYPE_CHECKING imports included), so the count of
floors is the longest import chain. Also whether reading can reach conversion, and how much
of the package opening a store imports. Writes the same as JSON.

    python -m bench.import_graph [--json bench/results/import_graph.json]   (from the repo root)
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

from tests.test_architecture import import_graph


def floors(graph, package: str = "tilestore") -> dict[str, int]:
    above = (f"{package}.embed", f"{package}.cli")  # the job and the command: not storage
    mods = sorted(
        m
        for m in graph.modules
        if m.startswith(package + ".") and not any(m == a or m.startswith(a + ".") for a in above)
    )

    @functools.cache
    def floor(module: str) -> int:
        deps = [
            d for d in graph.find_modules_directly_imported_by(module) if d in mods and d != module
        ]
        return 1 + max((floor(d) for d in deps), default=0)

    return {m: floor(m) for m in mods}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", type=Path, default=Path("bench/results/import_graph.json"))
    parser.add_argument("--opening", default="tilestore.reading.opening")
    parser.add_argument("--conversion", default="tilestore.conversion")
    args = parser.parse_args()
    graph = import_graph()  # as installed: tilestore.embed and tilestore.cli inside
    found = floors(graph)
    top = max(found.values())
    print(f"{len(found)} modules on {top} floors (the longest import chain)")
    for level in range(top, 0, -1):
        names = sorted(m.removeprefix("tilestore.") for m, f in found.items() if f == level)
        print(f"{level:3d}  {' '.join(names)}")
    reach = {m for m in graph.find_upstream_modules(args.opening) if m.startswith("tilestore.")}
    chain = next(
        (
            graph.find_shortest_chain(importer=args.opening, imported=m)
            for m in sorted(reach)
            if m.startswith(args.conversion)
        ),
        None,
    )
    print(f"{args.opening} imports {len(reach)} tilestore modules; to conversion: {chain}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {"floors": found, "opening_imports": sorted(reach), "opening_to_conversion": chain},
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
