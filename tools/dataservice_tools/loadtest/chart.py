"""The run's chart: load per lane, refusals, latency, the database's view,
new connections and liveness over time.

matplotlib comes with the ``loadtest`` extra; it is imported only here, when a
chart is drawn, so everything else runs without it.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any

from dataservice.enums import LaneName
from dataservice_tools.loadtest.invariants import CALLER_MARGIN_S
from dataservice_tools.loadtest.report import FINE_BIN_S

INSTALL_HINT = "pip install 'dataservice-tools[chart]'"
COLOURS = {LaneName.INTERACTIVE.value: "tab:blue", LaneName.BATCH.value: "tab:orange"}


def missing_dependency() -> str | None:
    """Why no chart can be drawn (matplotlib is not installed), or None."""
    if importlib.util.find_spec("matplotlib") is None:
        return f"dataservice loadtest draws its chart with matplotlib: {INSTALL_HINT}"
    return None


def _load(axis: Any, report: dict[str, Any], lane: str) -> None:
    """Offered, goodput per second and over the recovery window, capacity and target."""
    series, colour = report["series"], COLOURS[lane]
    t = series["t"]
    axis.plot(t, series[lane]["offered"], color="grey", linestyle=":", label="offered")
    axis.plot(t, series[lane]["goodput"], color=colour, label="goodput (per s)")
    config, recovery = report["config"], report.get("recovery")
    before = config["capacity_per_s"][lane]
    end = config["duration_s"]
    if recovery is not None and lane in recovery["lanes"]:
        at, figures = recovery["at_s"], recovery["lanes"][lane]
        rolling = recovery["rolling_goodput"]
        window = f"{recovery['window_s']:g} s"
        axis.plot(rolling["t"], rolling[lane], color=colour, alpha=0.5, label=f"goodput ({window})")
        after = figures["capacity_after_per_s"]
        axis.step(
            [0, at, end],
            [before, after, after],
            where="post",
            color="black",
            linestyle="--",
            linewidth=0.9,
            label="capacity",
        )
        axis.plot(
            [at, end],
            [figures["target_per_s"]] * 2,
            color="tab:green",
            linewidth=0.9,
            linestyle="-.",
            label="recovery target",
        )
    else:
        axis.axhline(before, color="black", linestyle="--", linewidth=0.9, label="capacity")
    axis.set_ylabel(f"{lane} req/s")
    axis.legend(fontsize="x-small", ncol=3, loc="upper right")


def _refusals(axis: Any, report: dict[str, Any]) -> None:
    series = report["series"]
    for lane, colour in COLOURS.items():
        for outcome, style in (("rejected", "-"), ("timeout", "--"), ("unavailable", ":")):
            axis.plot(
                series["t"],
                series[lane][outcome],
                color=colour,
                linestyle=style,
                label=f"{lane} {outcome}",
            )
    axis.set_ylabel("refused / timed out per s")
    axis.legend(fontsize="x-small", ncol=3, loc="upper right")


def _latency(axis: Any, report: dict[str, Any]) -> None:
    series = report["series"]
    for lane, colour in COLOURS.items():
        p50 = [math.nan if v is None else v for v in series[lane]["p50_ms"]]
        p99 = [math.nan if v is None else v for v in series[lane]["p99_ms"]]
        axis.plot(series["t"], p50, color=colour, linestyle="--", label=f"{lane} p50")
        axis.plot(series["t"], p99, color=colour, label=f"{lane} p99")
    axis.set_ylabel("latency ms (ok)")
    axis.set_yscale("log")
    axis.legend(fontsize="x-small", ncol=2, loc="upper right")
    if "fault" in report:
        _slowest(axis.twinx(), report)


def _slowest(axis: Any, report: dict[str, Any]) -> None:
    """A fault run's slowest call each second against its timeout, and the margin."""
    per_s = report["fault"]["slowest_past_timeout_ms_per_s"]
    axis.plot(
        report["series"]["t"][: len(per_s)],
        [math.nan if v is None else v for v in per_s],
        color="tab:red",
        marker=".",
        linewidth=0.8,
        label="slowest call past its timeout (ms)",
    )
    axis.axhline(0, color="tab:red", linestyle=":", linewidth=0.8)
    margin = CALLER_MARGIN_S * 1000
    axis.axhline(margin, color="tab:red", linestyle="--", linewidth=0.8, label=f"+{margin:g} ms")
    axis.set_ylabel("past timeout ms", color="tab:red")
    axis.legend(fontsize="x-small", loc="lower right")


def _database(axis: Any, report: dict[str, Any], db: dict[str, Any]) -> None:
    t = report["series"]["t"]
    axis.plot(t, db["max_connections"][: len(t)], color="tab:green", label="connections")
    axis.plot(t, db["max_active"][: len(t)], color="tab:red", label="active statements")
    axis.step(
        t,
        db["share_connections"][: len(t)],
        where="post",
        color="black",
        label="share (connections)",
    )
    axis.step(
        t,
        db["share_active"][: len(t)],
        where="post",
        color="black",
        linestyle=":",
        label="share (active)",
    )
    whole = report["budget"]["service_share_active"]
    # Scaled to the run's own share, where the invariant is: the whole
    # service's share is drawn only when it fits, and named either way.
    top = max(*db["share_connections"], *db["max_connections"], 1) * 1.3
    label = f"whole-service share {whole}"
    if whole <= top:
        axis.axhline(whole, color="grey", linestyle="--", label=label)
    else:
        axis.plot([], [], color="grey", linestyle="--", label=f"{label} (above)")
    axis.set_ylim(0, top)
    axis.set_ylabel("database (sampled)")
    axis.legend(fontsize="x-small", ncol=3, loc="upper right")


def _new_connections(axis: Any, report: dict[str, Any], db: dict[str, Any]) -> None:
    fine = db.get("new_connections_per_100ms", [])
    axis.plot(
        [n * FINE_BIN_S for n in range(len(fine))],
        [n / FINE_BIN_S for n in fine],
        color="tab:purple",
        drawstyle="steps-post",
        label="new connections/s (per 100 ms)",
    )
    axis.plot(
        report["series"]["t"],
        db["new_connections"][: len(report["series"]["t"])],
        color="tab:purple",
        alpha=0.4,
        label="new connections (per s)",
    )
    ramp = report["verdicts"].get("connection_ramp", {})
    if ramp.get("checked"):
        # The ramp's steady rate for all processes (each may add its burst at once).
        rate = ramp["processes"] * report["budget"]["connect_rate_per_s"]
        axis.axhline(rate, color="grey", linestyle="--", label=f"connect ramp rate {rate:g}/s")
    axis.set_ylabel("new connections/s")
    axis.legend(fontsize="x-small", ncol=3, loc="upper right")


def _liveness(axis: Any, report: dict[str, Any]) -> None:
    liveness = report["liveness"]
    axis.set_ylabel("liveness")
    if not liveness["applicable"]:
        axis.text(
            0.5,
            0.5,
            "liveness: not applicable (no health check in the baseline)",
            ha="center",
            va="center",
            transform=axis.transAxes,
        )
        axis.set_yticks([])
        return
    series = liveness["series"]
    ok = [1 if v else 0 for v in series["ok"]]
    axis.fill_between(
        series["t"],
        0,
        ok,
        step="post",
        color="tab:green",
        alpha=0.3,
        label="live (health --alive-file)",
    )
    red = [1 if not v else 0 for v in series["ok"]]
    axis.fill_between(
        series["t"], 0, red, step="post", color="tab:red", alpha=0.6, label="not live"
    )
    ages = [math.nan if v is None else v / liveness["max_age_s"] for v in series["oldest_age_s"]]
    axis.plot(
        series["t"],
        ages,
        color="black",
        linewidth=0.8,
        label=f"oldest alive file / max age {liveness['max_age_s']:g} s",
    )
    axis.set_ylim(0, 1.15)
    axis.legend(fontsize="x-small", ncol=3, loc="lower right")


def write_chart(path: Path, report: dict[str, Any], title: str) -> None:
    """Seven panels over time, sharing the run's clock; events as vertical lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    db = report["database"].get("series", {})
    fig, axes = plt.subplots(7, 1, figsize=(9, 16), sharex=True)
    _load(axes[0], report, LaneName.INTERACTIVE.value)
    _load(axes[1], report, LaneName.BATCH.value)
    _refusals(axes[2], report)
    _latency(axes[3], report)
    if db:
        _database(axes[4], report, db)
        _new_connections(axes[5], report, db)
    _liveness(axes[6], report)
    axes[-1].set_xlabel("seconds")
    for event, at in report.get("events", {}).items():
        for axis in axes:
            axis.axvline(at, color="grey", linewidth=0.8)
        axes[0].annotate(event, (at, 0), fontsize="x-small", rotation=90, va="bottom")
    fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
