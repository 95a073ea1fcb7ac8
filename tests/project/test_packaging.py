"""Files the service loads by path (migrations, Lua scripts, .proto) must ship
in the package: an install that is not editable would otherwise lack them."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "dataservice"


def _shipped() -> set[Path]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = data["tool"]["setuptools"]["package-data"]["dataservice"]
    return {path for pattern in patterns for path in PACKAGE.glob(pattern)}


def test_files_loaded_by_path_are_package_data() -> None:
    loaded_by_path = [
        *PACKAGE.glob("store/migrations/*.py"),
        *PACKAGE.glob("store/migrations/*.mako"),
        *PACKAGE.glob("store/migrations/versions/*.py"),
        *PACKAGE.rglob("*.lua"),
        *PACKAGE.rglob("*.proto"),
    ]
    assert loaded_by_path
    missing = sorted(str(p.relative_to(ROOT)) for p in loaded_by_path if p not in _shipped())
    assert not missing, f"not in [tool.setuptools.package-data]: {missing}"
