"""The two wheels work installed, not only from this checkout: the runtime
wheel (``dataservice``) carries the service alone, and the tooling wheel
(``dataservice-tools``: the load harness, the demo, the private-service starter)
adds its commands to it; the chart's dependency stays an extra of the tooling.

Each wheel is built from a copy of what it is made of (so no build output lands
in the checkout), installed into a fresh virtualenv outside the checkout, and
its commands run from another directory. Their dependencies are this
environment's (the new virtualenv reads them from here, after its own site
directory: the installed wheels are what it imports), not downloaded again.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from dataservice_tools.loadtest.cli import write_outputs
from packaging.requirements import Requirement
from rich.console import Console

from tests.conftest import SHIPPED_CONFIG, require

ROOT = Path(__file__).resolve().parents[2]
# What each wheel is built from: its project file, readme and packages.
RUNTIME_SOURCES = ("pyproject.toml", "README.md", "dataservice")
TOOLS_SOURCES = ("tools/pyproject.toml", "tools/dataservice_tools")
# What would tie the installed code to a checkout.
CHECKOUT_MARKS = (str(ROOT), "__file__", "parents[", "sys.path", "bench.", "bench/")
# Modules of the tooling that the runtime wheel must not carry, by name.
TOOLING_NAMES = {"loadtest", "demo", "localservices", "dataservice_tools", "workers"}


def _clean_environ() -> dict[str, str]:
    """This environment without our settings or anything pointing into the checkout."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("DATASERVICE_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")
    }


def _run(
    argv: list[str], cwd: Path, timeout: float, *, code: int = 0, **env: str
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        argv, cwd=cwd, env={**_clean_environ(), **env},
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    assert done.returncode == code, f"{argv}:\n{done.stdout}\n{done.stderr}"
    return done


PURELIB = "import sysconfig; print(sysconfig.get_paths()['purelib'])"


def _metadata(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(archive.read(name).decode())
    return [Requirement(r) for r in metadata.get_all("Requires-Dist") or []]


def _extra_requirements(wheel: Path, extra: str) -> list[str]:
    """The names of what the wheel requires with ``extra`` and not without it."""
    return sorted(
        r.name
        for r in _metadata(wheel)
        if r.marker is not None
        and r.marker.evaluate({"extra": extra})
        and not r.marker.evaluate({"extra": ""})
    )


def _build(sources: tuple[str, ...], into: Path, wheels: Path, cwd: Path) -> Path:
    """The wheel of the project whose files are ``sources`` (paths from the root)."""
    project = Path(sources[0]).parent
    for name in sources:
        origin, target = ROOT / name, into / Path(name).relative_to(project)
        if origin.is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
            shutil.copytree(origin, target, ignore=ignore)
        else:
            shutil.copy2(origin, target)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    _run([*pip, "wheel", "--no-deps", "-q", "-w", str(wheels), str(into)], cwd, 300)
    (wheel,) = [w for w in wheels.glob("*.whl") if w.name.startswith(into.name)]
    return wheel


def _checkout_ties(package: Path) -> list[str]:
    return [
        f"{f.relative_to(package)}: {mark}"
        for f in package.rglob("*.py")
        for mark in CHECKOUT_MARKS
        if mark in f.read_text(encoding="utf-8")
    ]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_runtime_wheel_carries_the_service_alone_and_the_tooling_adds_its_commands(
    tmp_path: Path,
) -> None:
    require(importlib.util.find_spec("ensurepip") is not None, "ensurepip (python3-venv)")
    wheels, venv, elsewhere = tmp_path / "wheels", tmp_path / "venv", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "dataservice").mkdir()
    (tmp_path / "dataservice_tools").mkdir()
    runtime = _build(RUNTIME_SOURCES, tmp_path / "dataservice", wheels, elsewhere)
    tools = _build(TOOLS_SOURCES, tmp_path / "dataservice_tools", wheels, elsewhere)

    with zipfile.ZipFile(runtime) as archive:
        names = archive.namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"dataservice", "dataservice-0.1.0.dist-info"}, tops
    carried = {part.removesuffix(".py") for name in names for part in name.split("/")}
    assert not carried & TOOLING_NAMES, sorted(carried & TOOLING_NAMES)
    assert "matplotlib" not in {r.name for r in _metadata(runtime)}
    assert [r.name for r in _metadata(tools) if r.marker is None] == ["dataservice"]
    assert _extra_requirements(tools, "chart") == ["matplotlib"]

    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], elsewhere, 120)
    python = venv / "bin" / "python"
    site = Path(_run([str(python), "-c", PURELIB], elsewhere, 60).stdout.strip())
    # Appended to sys.path after the venv's own site directory, and its .pth
    # files are not read. What this checkout installed (its editable packages
    # and their metadata, entry points included) is left out.
    dependencies = tmp_path / "dependencies"
    dependencies.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.startswith(("dataservice", "__editable__")):
            (dependencies / entry.name).symlink_to(entry)
    (site / "dependencies.pth").write_text(f"{dependencies}\n")
    # This environment's pip, run by the new interpreter: it installs there.
    install = [str(python), "-m", "pip", "--disable-pip-version-check", "install", "-q"]
    _run([*install, "--no-deps", "--no-compile", str(runtime)], elsewhere, 300)

    # The service alone: its commands work, the tooling's are absent and say so.
    dataservice = str(venv / "bin" / "dataservice")
    config = {"DATASERVICE_CONFIG": str(SHIPPED_CONFIG)}
    assert "loadtest" not in _run([dataservice, "--help"], elsewhere, 60).stdout
    checked = _run([dataservice, "check-config"], elsewhere, 60, **config)
    assert "within budget" in checked.stdout
    demo = _run([dataservice, "run", "--demo", "1"], elsewhere, 60, code=2, **config)
    assert "dataservice-tools" in demo.stderr

    _run([*install, "--no-deps", "--no-compile", str(tools)], elsewhere, 300)
    assert "loadtest" in _run([dataservice, "--help"], elsewhere, 60).stdout
    assert "--scenario" in _run([dataservice, "loadtest", "--help"], elsewhere, 60).stdout
    located = _run(
        [str(python), "-c", "import dataservice, dataservice_tools as t; print(t.__file__)"],
        elsewhere, 60,
    )  # fmt: skip
    package = Path(located.stdout.strip()).parent
    assert venv in package.parents, package
    assert (package / "loadtest" / "naive.py").is_file()
    assert not _checkout_ties(package)
    # The runtime modules that start processes (package paths alone).
    assert not _checkout_ties(site / "dataservice" / "ops")


@pytest.mark.slow
def test_without_matplotlib_every_command_still_works(
    tmp_path: Path,
) -> None:
    """As if installed without the extra: matplotlib cannot be imported."""

    def cli(*args: str, **environ: str) -> subprocess.CompletedProcess[str]:
        hide = "import sys; sys.modules['matplotlib'] = None; from dataservice.cli import main; "
        env = {**_clean_environ(), "DATASERVICE_CONFIG": str(SHIPPED_CONFIG), **environ}
        return subprocess.run(
            [sys.executable, "-c", hide + f"sys.argv = ['dataservice', *{list(args)!r}]; main()"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    assert cli("loadtest", "--help").returncode == 0
    # A run starts without it (here it stops at the broker, which is nowhere).
    nowhere = cli(
        "loadtest", "--scenario", "steady", DATASERVICE_BROKER_URL="amqp://guest:guest@127.0.0.1:1/"
    )
    assert nowhere.returncode == 1, nowhere.stderr
    assert "error: RabbitMQ at 127.0.0.1:1/" in nowhere.stdout
    assert "matplotlib" not in nowhere.stdout + nowhere.stderr
    checked = cli("check-config")
    assert checked.returncode == 0, checked.stderr
    assert "within budget" in checked.stdout


def test_a_run_without_matplotlib_writes_its_report_and_no_chart(tmp_path: Path) -> None:
    console = Console(file=io.StringIO(), width=200)
    why = "matplotlib is missing: pip install 'dataservice-tools[chart]'"
    write_outputs(console, tmp_path, "service", {"scenario": "steady"}, "service: steady", why)
    assert json.loads((tmp_path / "report.json").read_text()) == {"scenario": "steady"}
    assert not (tmp_path / "chart.png").exists()
    assert console.file.getvalue().strip() == f"service: report {tmp_path / 'report.json'}"
