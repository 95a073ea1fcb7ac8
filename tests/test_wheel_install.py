"""The tools work from an installed wheel, not only from this checkout, and the
load test's chart dependency stays an extra.

The wheel is built from a copy of what it is made of (so no build output lands
in the checkout), installed into a fresh virtualenv outside the checkout, and
its commands run from another directory. Its dependencies are this
environment's (the new virtualenv reads them from here, after its own site
directory: the installed wheel is what it imports), not downloaded again: what
pip would install for ``dataservice[loadtest]`` is what the wheel's metadata
declares, checked here.
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
from packaging.requirements import Requirement
from rich.console import Console

from dataservice.loadtest.cli import write_outputs
from tests.conftest import SHIPPED_CONFIG, require

ROOT = Path(__file__).resolve().parents[1]
# What the wheel is built from: the project file, its readme and its packages.
SOURCES = ("pyproject.toml", "README.md", "dataservice", "workers")
# What would tie the installed code to a checkout.
CHECKOUT_MARKS = (str(ROOT), "__file__", "parents[", "sys.path", "bench.", "bench/")


def _clean_environ() -> dict[str, str]:
    """This environment without our settings or anything pointing into the checkout."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("DATASERVICE_") and k not in ("PYTHONPATH", "VIRTUAL_ENV")
    }


def _run(
    argv: list[str], cwd: Path, timeout: float, **env: str
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        argv, cwd=cwd, env={**_clean_environ(), **env},
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"{argv}:\n{done.stdout}\n{done.stderr}"
    return done


PURELIB = "import sysconfig; print(sysconfig.get_paths()['purelib'])"


def _extra_requirements(wheel: Path, extra: str) -> list[str]:
    """The names of what the wheel requires with ``extra`` and not without it."""
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(archive.read(name).decode())
    requirements = [Requirement(r) for r in metadata.get_all("Requires-Dist") or []]
    return sorted(
        r.name
        for r in requirements
        if r.marker is not None
        and r.marker.evaluate({"extra": extra})
        and not r.marker.evaluate({"extra": ""})
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_wheel_installs_and_runs_outside_the_checkout_and_declares_the_loadtest_extra(
    tmp_path: Path,
) -> None:
    require(importlib.util.find_spec("ensurepip") is not None, "ensurepip (python3-venv)")
    source = tmp_path / "source"
    source.mkdir()
    for name in SOURCES:
        origin = ROOT / name
        if origin.is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
            shutil.copytree(origin, source / name, ignore=ignore)
        else:
            shutil.copy2(origin, source / name)
    wheels, venv, elsewhere = tmp_path / "wheels", tmp_path / "venv", tmp_path / "elsewhere"
    elsewhere.mkdir()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    _run([*pip, "wheel", "--no-deps", "-q", "-w", str(wheels), str(source)], elsewhere, 300)
    (wheel,) = wheels.glob("dataservice-*.whl")
    assert _extra_requirements(wheel, "loadtest") == ["matplotlib"]
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], elsewhere, 120)
    python = venv / "bin" / "python"
    site = Path(_run([str(python), "-c", PURELIB], elsewhere, 60).stdout.strip())
    # Appended to sys.path after the venv's own site directory, and its own
    # .pth files (this checkout's editable install among them) are not read.
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # This environment's pip, run by the new interpreter: it installs there.
    install = [str(python), "-m", "pip", "--disable-pip-version-check", "install", "-q"]
    _run([*install, "--no-deps", "--no-compile", str(wheel)], elsewhere, 300)

    dataservice = str(venv / "bin" / "dataservice")
    assert "loadtest" in _run([dataservice, "--help"], elsewhere, 60).stdout
    checked = _run(
        [dataservice, "check-config"], elsewhere, 60, DATASERVICE_CONFIG=str(SHIPPED_CONFIG)
    )
    assert "within budget" in checked.stdout
    assert "--scenario" in _run([dataservice, "loadtest", "--help"], elsewhere, 60).stdout
    located = _run(
        [str(python), "-c", "import dataservice, matplotlib; print(dataservice.__file__)"],
        elsewhere, 60,
    )  # fmt: skip
    package = Path(located.stdout.strip()).parent
    assert venv in package.parents, package

    installed = [package / "localservices", package / "loadtest", package / "processes.py"]
    files = [f for path in installed for f in ([path] if path.is_file() else path.rglob("*.py"))]
    assert any(f.name == "naive.py" for f in files)
    ties = [
        f"{f.relative_to(package)}: {mark}"
        for f in files
        for mark in CHECKOUT_MARKS
        if mark in f.read_text(encoding="utf-8")
    ]
    assert not ties, ties


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
    why = "matplotlib is missing: pip install 'dataservice[loadtest]'"
    write_outputs(console, tmp_path, "service", {"scenario": "steady"}, "service: steady", why)
    assert json.loads((tmp_path / "report.json").read_text()) == {"scenario": "steady"}
    assert not (tmp_path / "chart.png").exists()
    assert console.file.getvalue().strip() == f"service: report {tmp_path / 'report.json'}"
