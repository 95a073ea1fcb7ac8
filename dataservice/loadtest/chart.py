"""The run's chart: goodput, latency and the database's view over time.

matplotlib comes with the ``loadtest`` extra; it is imported only here, when a
chart is drawn, so everything else runs without it.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any

from dataservice.enums import LaneName

INSTALL_HINT = "pip install 'dataservice[loadtest]'"


def missing_dependency() -> str | None:
    """Why no chart can be drawn (matplotlib is not installed), or None."""
    if importlib.util.find_spec("matplotlib") is None:
        return f"dataservice loadtest draws its chart with matplotlib: {INSTALL_HINT}"
    return None


def write_chart(path: Path, report: dict[str, Any], title: str) -> None:
    """Three panels over time: goodput per lane, latency per lane, the database's view."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = report["series"]
    db = report["database"].get("series", {})
    t = series["t"]
    fig, (top, mid, bottom) = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    colours = {LaneName.INTERACTIVE.value: "tab:blue", LaneName.BATCH.value: "tab:orange"}
    for lane, colour in colours.items():
        top.plot(t, series[lane]["offered"], color=colour, linestyle=":", label=f"{lane} offered")
        top.plot(t, series[lane]["goodput"], color=colour, label=f"{lane} goodput")
        p50 = [math.nan if v is None else v for v in series[lane]["p50_ms"]]
        p99 = [math.nan if v is None else v for v in series[lane]["p99_ms"]]
        mid.plot(t, p50, color=colour, linestyle="--", label=f"{lane} p50")
        mid.plot(t, p99, color=colour, label=f"{lane} p99")
    top.set_ylabel("requests/s")
    top.legend(fontsize="small", ncol=2)
    mid.set_ylabel("latency ms (ok)")
    mid.set_yscale("log")
    mid.legend(fontsize="small", ncol=2)
    if db:
        bottom.plot(t, db["max_connections"][: len(t)], color="tab:green", label="connections")
        bottom.plot(t, db["max_active"][: len(t)], color="tab:red", label="active statements")
        bottom.step(
            t, db["share_active"][: len(t)], where="post", color="black", label="share (active)"
        )
        bottom.plot(t, db["new_connections"][: len(t)], color="tab:purple", label="new conns/s")
        whole = report["budget"]["service_share_active"]
        bottom.axhline(whole, color="grey", linestyle="--", label=f"whole-service share {whole}")
        bottom.set_ylim(0, max(whole, *db["max_connections"], *db["new_connections"], 1) * 1.1)
    bottom.set_ylabel("database (sampled)")
    bottom.set_xlabel("seconds")
    bottom.legend(fontsize="small", ncol=3)
    for event, at in report.get("events", {}).items():
        for axis in (top, mid, bottom):
            axis.axvline(at, color="grey", linewidth=0.8)
        top.annotate(event, (at, 0), fontsize="x-small", rotation=90, va="bottom")
    fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
