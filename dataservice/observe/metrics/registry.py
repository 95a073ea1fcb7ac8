"""The process's one registry and its HTTP endpoint."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, start_http_server

# One per process, served at one address: every worker, consumer and Flower
# process is a scrape target of its own (the thread pool shares it), so no
# multiprocess aggregation is needed.
REGISTRY = CollectorRegistry(auto_describe=True)


def serve(port: int, address: str = "127.0.0.1") -> None:
    """Expose the registry at ``http://address:port/metrics`` (a daemon thread)."""
    start_http_server(port, addr=address, registry=REGISTRY)
