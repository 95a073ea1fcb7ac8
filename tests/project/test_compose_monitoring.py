"""Flower, Prometheus and Grafana in compose/: Flower's credentials come from a
compose variable, Prometheus scrapes every process that serves metrics, and
the Grafana dashboard has a panel per runbook symptom whose queries name only
metrics the service (or Flower) exports.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from prometheus_client import CollectorRegistry

import dataservice.observe.metrics
from dataservice.cli.flower import check_auth
from tests.harness.compose_file import (
    COMPOSE_DIR,
    RAW_SERVICES,
    REQUIRED_VARIABLES,
    SERVICES,
    bind_mounts,
    command,
    environment,
    load_yaml,
    parse,
    published_ports,
    settings,
)

PROMETHEUS = load_yaml(COMPOSE_DIR / "prometheus.yml")
GRAFANA = COMPOSE_DIR / "grafana"
DATASOURCES = load_yaml(GRAFANA / "provisioning" / "datasources" / "prometheus.yml")
PROVIDERS = load_yaml(GRAFANA / "provisioning" / "dashboards" / "dataservice.yml")
DASHBOARD: dict[str, Any] = json.loads((GRAFANA / "dashboards" / "dataservice.json").read_text())
SYMPTOMS = (
    "Queue growing",
    "Rejections rising",
    "Permits saturated",
    "Reconnect ramp",
    "Redis down",
    "Consumer lagging",
    "Cache rollout and rollback",
)
# The sample names each family type exposes (prometheus_client's exposition).
SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
    "info": ("_info",),
}
_PROMQL_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}
_PROMQL_NOISE = re.compile(
    r'"(?:\\.|[^"\\])*"'  # strings
    r"|\{[^}]*\}"  # label matchers
    r"|\[[^\]]*\]"  # ranges
    r"|\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"  # label lists
)
# A whole name (not part of a number, a duration or $__rate_interval), and
# what follows it: a function or an aggregation is followed by "(".
_IDENTIFIER = re.compile(r"(?<![\w.$])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?")


def _metrics_processes() -> Iterator[tuple[str, dict[str, Any]]]:
    """(service, parsed parameters) of each process that serves metrics."""
    for name, service in SERVICES.items():
        line = command(service)
        if line[:1] in (["dataservice"], ["celery"]):
            _, params = parse(line)
            if params.get("metrics_port"):
                yield name, params


def _jobs() -> dict[str, dict[str, Any]]:
    return {job["job_name"]: job for job in PROMETHEUS["scrape_configs"]}


def _panels() -> list[dict[str, Any]]:
    return [panel for panel in DASHBOARD["panels"] if panel.get("type") != "row"]


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects."""
    bare = _PROMQL_NOISE.sub(" ", expr)
    return {
        name
        for name, call in _IDENTIFIER.findall(bare)
        if not call and name.lower() not in _PROMQL_KEYWORDS
    }


def _registries() -> Iterator[CollectorRegistry]:
    modules = [dataservice.observe.metrics]
    if hasattr(dataservice.observe.metrics, "__path__"):
        for found in pkgutil.walk_packages(
            dataservice.observe.metrics.__path__, "dataservice.observe.metrics."
        ):
            modules.append(importlib.import_module(found.name))
    seen: set[int] = set()
    for module in modules:
        for value in vars(module).values():
            if isinstance(value, CollectorRegistry) and id(value) not in seen:
                seen.add(id(value))
                yield value


def exported_names() -> set[str]:
    """Every sample name the service's registries and Flower's metrics expose."""
    from flower.events import get_prometheus_metrics

    families = [family for registry in _registries() for family in registry.collect()]
    flower = get_prometheus_metrics()
    families += [family for metric in vars(flower).values() for family in metric.describe()]
    return {family.name + suffix for family in families for suffix in SUFFIXES[family.type]}


# Metrics endpoints and Prometheus --------------------------------------------


@pytest.mark.parametrize("name", ["worker-interactive", "worker-batch", "changes"])
def test_every_pool_and_consumer_serves_metrics_to_the_compose_network(name: str) -> None:
    params = dict(_metrics_processes()).get(name)
    assert params is not None, f"{name} serves no metrics (--metrics-port)"
    assert params["metrics_port"] == 9100
    # On loopback Prometheus, in another container, could not reach it.
    assert params["metrics_address"] == "0.0.0.0"


def test_prometheus_scrapes_every_replica_of_every_process_that_serves_metrics() -> None:
    jobs = _jobs()
    for name, params in _metrics_processes():
        # Compose answers the service's name with every replica's address.
        found = [
            sd
            for job in jobs.values()
            for sd in job.get("dns_sd_configs") or []
            if sd.get("names") == [name]
        ]
        assert len(found) == 1, f"{name}: one dns_sd_configs entry expected, found {found}"
        assert found[0]["type"] == "A"
        assert found[0]["port"] == params["metrics_port"]


def test_every_scrape_target_is_a_compose_service() -> None:
    for job in _jobs().values():
        names = [n for sd in job.get("dns_sd_configs") or [] for n in sd["names"]]
        targets = [t for static in job.get("static_configs") or [] for t in static["targets"]]
        assert names or targets, f"{job['job_name']} scrapes nothing"
        for host in [*names, *(t.rpartition(":")[0] for t in targets)]:
            assert host in SERVICES, f"{job['job_name']}: {host!r} is not a service"


def test_prometheus_scrapes_flowers_metrics_page() -> None:
    _, params = parse(command(SERVICES["flower"]))
    flower = [job for job in _jobs().values() if job.get("static_configs")]
    assert [t for job in flower for s in job["static_configs"] for t in s["targets"]] == [
        f"flower:{params['port']}"
    ]
    assert flower[0].get("metrics_path", "/metrics") == "/metrics"


def test_prometheus_reads_this_file_and_keeps_its_data_in_a_volume() -> None:
    service = SERVICES["prometheus"]
    mounts = {target: (source, ro) for source, target, ro in bind_mounts(service)}
    assert mounts["/etc/prometheus/prometheus.yml"] == (COMPOSE_DIR / "prometheus.yml", True)
    assert "--config.file=/etc/prometheus/prometheus.yml" in command(service)
    assert "prometheus-data:/prometheus" in service["volumes"]


# Flower ------------------------------------------------------------------------


def test_flower_listens_on_the_port_compose_publishes_on_loopback() -> None:
    path, params = parse(command(SERVICES["flower"]))
    assert path == "dataservice flower"
    assert (params["address"], params["port"], params["no_auth"]) == ("0.0.0.0", 5555, False)
    assert published_ports(SERVICES["flower"]) == [("127.0.0.1", "5555")]


def test_flower_credentials_come_from_a_compose_variable_never_the_command_line() -> None:
    raw = RAW_SERVICES["flower"]["environment"]["DATASERVICE_FLOWER_AUTH"]
    assert raw.startswith("${FLOWER_AUTH:?"), "a variable with no default in the file"
    auth = settings(SERVICES["flower"]).flower_auth
    assert auth is not None
    assert check_auth(auth) is None
    assert auth not in " ".join(command(SERVICES["flower"]))


def test_credentials_have_no_default_anywhere_in_the_files() -> None:
    # The stack and the overlays laid over it (compose/rabbitmq.yml).
    text = "".join(path.read_text(encoding="utf-8") for path in COMPOSE_DIR.glob("*.yml"))
    for name in REQUIRED_VARIABLES:
        uses = re.findall(r"\$\{" + name + r"(:?[-?+])?", text)
        assert uses, f"{name} is not used"
        assert set(uses) == {":?"}, f"{name} must be ${{{name}:?...}} everywhere"


# Grafana -----------------------------------------------------------------------


def test_grafana_is_provisioned_with_prometheus_and_the_dashboard_files() -> None:
    service = SERVICES["grafana"]
    mounts = {target: (source, ro) for source, target, ro in bind_mounts(service)}
    provisioning = GRAFANA / "provisioning"
    for kind in ("datasources", "dashboards"):
        assert mounts[f"/etc/grafana/provisioning/{kind}"] == (provisioning / kind, True)
    (provider,) = PROVIDERS["providers"]
    assert (PROVIDERS["apiVersion"], provider["type"]) == (1, "file")
    assert mounts[provider["options"]["path"]] == (GRAFANA / "dashboards", True)
    (source,) = DATASOURCES["datasources"]
    assert (DATASOURCES["apiVersion"], source["type"]) == (1, "prometheus")
    url = urlsplit(source["url"])
    (_, prometheus_port), *_ = published_ports(SERVICES["prometheus"])
    assert (url.hostname, str(url.port)) == ("prometheus", prometheus_port)
    for panel in _panels():
        assert panel["datasource"]["uid"] == source["uid"], panel["title"]


def test_grafanas_admin_password_comes_from_a_compose_variable() -> None:
    raw = RAW_SERVICES["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"]
    assert raw.startswith("${GRAFANA_ADMIN_PASSWORD:?")
    assert environment(SERVICES["grafana"])["GF_AUTH_ANONYMOUS_ENABLED"] == "false"


def test_the_dashboard_has_one_panel_per_runbook_symptom() -> None:
    titles = [panel["title"] for panel in _panels()]
    for symptom in SYMPTOMS:
        assert titles.count(symptom) == 1, f"{symptom!r}: {titles.count(symptom)} panels"
    assert len(set(titles)) == len(titles), "two panels share a title"
    assert len({panel["id"] for panel in DASHBOARD["panels"]}) == len(DASHBOARD["panels"])


def test_every_panel_queries_something() -> None:
    for panel in _panels():
        exprs = [target.get("expr", "") for target in panel.get("targets") or []]
        assert exprs, f"{panel['title']}: no query"
        assert all(metric_names(expr) for expr in exprs), f"{panel['title']}: a query names none"


def test_every_metric_a_panel_queries_is_one_the_service_or_flower_exports() -> None:
    exported = exported_names()
    missing = sorted(
        f"{panel['title']}: {name}"
        for panel in _panels()
        for target in panel.get("targets") or []
        for name in metric_names(target["expr"])
        if name not in exported
    )
    assert not missing, "metrics no registry exports:\n" + "\n".join(missing)


def test_metric_names_are_read_out_of_promql() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (lane, le) (rate(a_bucket{stage="x"}[$__rate_interval])))'
        " / max(b and on (instance) (c == 1)) + count without (le) (d_total offset 5m)"
    )
    assert metric_names(expr) == {"a_bucket", "b", "c", "d_total"}
