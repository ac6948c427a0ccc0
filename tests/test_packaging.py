"""One import name: installing tilestore puts `tilestore` and nothing else at the top level of
site-packages (the folders embed/ and cli/ install as tilestore.embed and tilestore.cli), so
no other distribution's `embed` or `cli` can clash with ours."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import tomllib
from importlib.metadata import Distribution
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"tilestore": "tilestore", "embed": "tilestore.embed", "cli": "tilestore.cli"}


def distribution() -> Distribution:
    """The installed distribution's metadata in site-packages (an editable build also leaves
    a tilestore.egg-info in the project folder, which lists the source files instead)."""
    site = Path(sysconfig.get_paths()["purelib"])
    (found,) = site.glob("tilestore-*.dist-info")
    return Distribution.at(found)


def _top_level_names(dist) -> set[str]:
    names = set()
    for file in dist.files or ():
        top = file.parts[0]
        if top.endswith((".dist-info", ".egg-info")) or top == "..":  # metadata, scripts
            continue
        if top.startswith("__editable__") or top == "__pycache__":  # the editable finder
            continue
        names.add(top.removesuffix(".py"))
    return names


def test_the_installed_distribution_has_one_top_level_name():
    dist = distribution()
    top_level = (dist.read_text("top_level.txt") or "tilestore").split()
    assert top_level == ["tilestore"]
    assert _top_level_names(dist) <= {"tilestore"}


def test_an_editable_install_maps_only_tilestore():
    """An editable install's finder maps import names to folders: only tilestore's."""
    dist = distribution()
    finders = [
        f for f in dist.files or () if f.name.startswith("__editable__") and f.suffix == ".py"
    ]
    for finder in finders:
        text = Path(finder.locate()).read_text()
        mapping = text.split("MAPPING", 1)[1].split("\n", 1)[0]
        assert "'embed'" not in mapping and "'cli'" not in mapping, mapping
        assert "'tilestore.embed'" in mapping and "'tilestore.cli'" in mapping


def test_embed_and_cli_import_only_under_tilestore(tmp_path):
    code = (
        "import importlib.util as u, tilestore.embed, tilestore.cli.main; "
        "print(u.find_spec('embed'), u.find_spec('cli'))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert run.stdout.split() == ["None", "None"]


def test_the_command_and_codec_entry_points_name_tilestore_modules():
    dist = distribution()
    targets = {ep.group: ep.value for ep in dist.entry_points}
    assert targets["console_scripts"] == "tilestore.cli.main:main"
    assert targets["zarr.codecs"].startswith("tilestore.")
    for ep in dist.entry_points:
        assert ep.load() is not None, ep


def test_pyproject_lists_every_package_folder():
    """setuptools is given the packages by name (their folders are mapped): a package folder
    missing from the list would be left out of a wheel without a word."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {
        ".".join((FOLDERS[folder], *init.parent.relative_to(ROOT / folder).parts))
        for folder in FOLDERS
        for init in (ROOT / folder).rglob("__init__.py")
    }
    assert set(config["packages"]) == on_disk
    assert config["package-dir"] == {name: folder for folder, name in FOLDERS.items()}
