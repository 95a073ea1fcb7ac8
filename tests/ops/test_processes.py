"""The worker-process launcher: what it hands the worker, and that no worker
outlives the process that started it or a stop."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from dataservice_tools.testkit.waits import eventually

from dataservice.config.settings import Settings
from dataservice.enums import LaneName
from dataservice.errors import ServiceSetupError
from dataservice.ops.processes import WorkerProcess, stop_all, worker_argv, worker_environ

# A stand-in worker: says it is up, then sleeps; with IGNORE set it shrugs off SIGTERM.
SLEEPER = textwrap.dedent("""
    import os, signal, sys, time
    if os.environ.get("IGNORE"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("up", flush=True)
    time.sleep(60)
""")


def _sleeper(tmp_path: Path, name: str = "sleeper", **env: str) -> WorkerProcess:
    return WorkerProcess(
        [sys.executable, "-c", SLEEPER], {**worker_environ(), **env}, tmp_path / f"{name}.log", name
    )


def _gone(pid: int, within_s: float) -> bool:
    """Exited within ``within_s`` (a zombie counts: whoever adopted it may not reap it)."""

    def exited() -> bool:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        return state in ("Z", "X")

    return eventually(exited, timeout=within_s, interval=0.05, message=f"process {pid} to exit")


def test_worker_gets_its_lane_and_only_the_given_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DATASERVICE_BOGUS", "1")
    settings = Settings(config_path=tmp_path / "queues.yml")
    worker = WorkerProcess.for_lane(settings, LaneName.BATCH, tmp_path / "w.log", "--x", "1")
    assert worker.argv == [sys.executable, "-m", "dataservice.cli", "worker", "--lane", "batch",
                           "--x", "1"]  # fmt: skip
    assert worker.argv == worker_argv(LaneName.BATCH, "--x", "1")
    ours = {k: v for k, v in worker.environ.items() if k.startswith("DATASERVICE_")}
    assert ours == settings.to_env()


@pytest.mark.timeout(30)
def test_a_worker_that_exits_on_its_own_is_reported_with_its_log(tmp_path: Path) -> None:
    worker = WorkerProcess(
        [sys.executable, "-c", "print('bad config'); raise SystemExit(3)"],
        worker_environ(),
        tmp_path / "w.log",
        "broken",
    ).start()
    assert worker.wait(10) == 3
    with pytest.raises(ServiceSetupError, match=r"(?s)broken worker .* exited with 3.*bad config"):
        worker.check_alive()


@pytest.mark.timeout(30)
def test_stop_sends_sigterm_then_sigkill_after_the_grace(tmp_path: Path) -> None:
    polite = _sleeper(tmp_path, "polite").start()
    stubborn = _sleeper(tmp_path, "stubborn", IGNORE="1").start()
    for worker in (polite, stubborn):
        eventually(lambda w=worker: "up" in w.log_tail(), timeout=10, interval=0.05,
                   message=worker.log_tail)  # fmt: skip
    stop_all([polite, stubborn], grace_s=1.0)
    assert polite.returncode == -signal.SIGTERM
    assert stubborn.returncode == -signal.SIGKILL
    # Asked to stop: its exit is no failure.
    polite.check_alive()


@pytest.mark.timeout(30)
def test_a_worker_does_not_outlive_a_killed_parent(tmp_path: Path) -> None:
    """The parent is SIGKILLed, so it stops nothing itself: the kernel's SIGTERM must."""
    pid_file = tmp_path / "pid"
    parent_code = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from dataservice.ops.processes import WorkerProcess, worker_environ
        worker = WorkerProcess([sys.executable, "-c", {SLEEPER!r}], worker_environ(),
                               Path({str(tmp_path / "child.log")!r})).start()
        Path({str(pid_file)!r}).write_text(str(worker.pid))
        time.sleep(60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", parent_code])
    try:

        def started() -> bool:
            assert parent.poll() is None
            return pid_file.exists() and "up" in (tmp_path / "child.log").read_text()

        eventually(started, timeout=15, interval=0.05, message="the parent to start its worker")
        child = int(pid_file.read_text())
    finally:
        parent.kill()
        parent.wait()
    assert _gone(child, within_s=10), f"worker {child} outlived its parent"
