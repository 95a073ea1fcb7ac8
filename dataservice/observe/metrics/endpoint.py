"""Reading a process's metrics endpoint back: what the demo's summary and the
load harness's report take from the processes they started."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

SCRAPE_TIMEOUT_S = 2.0


def scrape_port(port: int, timeout_s: float = SCRAPE_TIMEOUT_S) -> list[Sample] | None:
    """Every sample ``127.0.0.1:port/metrics`` serves; None when it does not answer."""
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=timeout_s) as page:
            text = page.read().decode()
    except OSError:
        return None
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]
