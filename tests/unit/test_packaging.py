"""The installed distribution holds every package of the source tree.

`pip install .` (the quick start) builds a wheel from pyproject's explicit
`packages` list, while the test suite runs an editable install that finds
modules on the source path: a package left off the list passes every test here
and is missing from a real install. This once happened to server/metrics.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _source_packages(mapping: dict[str, str]) -> set[str]:
    found: set[str] = set()
    for name, directory in mapping.items():
        base = ROOT / directory
        for init in base.rglob("__init__.py"):
            relative = init.parent.relative_to(base)
            found.add(".".join((name, *relative.parts)))
    return found


def test_every_source_package_is_in_the_wheel() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    assert _source_packages(config["package-dir"]) - listed == set()
    # And nothing listed is missing on disk (a renamed package).
    assert listed - _source_packages(config["package-dir"]) == set()
