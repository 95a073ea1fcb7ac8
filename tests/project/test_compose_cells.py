"""compose/cells.yml, laid over compose/docker-compose.yml as compose merges
them (``-f`` both, ``extends`` resolved): three cells, cell a on a
Sentinel-managed Redis. Parsed, never run."""

from __future__ import annotations

import copy
import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from dataservice.config.budget import check_budget, process_share
from dataservice.config.model import load_config
from dataservice.enums import LaneName
from dataservice.redis.endpoints import SentinelTarget
from tests.harness.compose_file import (
    COMPOSE,
    COMPOSE_DIR,
    ROOT,
    bind_mounts,
    command,
    environment,
    interpolated,
    load_yaml,
    merged,
    parse,
    published_ports,
    server_options,
    settings,
)

OVERLAY = interpolated(load_yaml(COMPOSE_DIR / "cells.yml"))
CELLS_DIR = COMPOSE_DIR / "cells"
CONTAINER_CELLS_DIR = "/etc/dataservice/cells"
ROLLING_OVERLAP = 2
CONSUMER_CONNECTIONS = 4
RESERVED_CONNECTIONS = 20


def _merged_service(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Compose's merge of a service over another: mappings key by key,
    volumes by their target, anything else replaced."""
    result = copy.deepcopy(base)
    for key, value in over.items():
        if key == "extends":
            continue
        if key == "volumes":
            mounts = {_target(v): v for v in result.get("volumes", [])}
            mounts.update({_target(v): v for v in value})
            result["volumes"] = list(mounts.values())
        elif isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merged(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def _target(volume: Any) -> str:
    return str(volume["target"]) if isinstance(volume, dict) else str(volume).split(":")[1]


def _services() -> dict[str, dict[str, Any]]:
    services = copy.deepcopy(COMPOSE["services"])
    for name, over in OVERLAY["services"].items():
        extends = over.get("extends")
        if extends is not None:
            assert extends["file"] == "docker-compose.yml"
            base = COMPOSE["services"][extends["service"]]
        else:
            base = services.get(name, {})
        services[name] = _merged_service(base, over)
    return services


SERVICES = _services()
CELLS_FILE = yaml.safe_load((CELLS_DIR / "cells.yml").read_text())["cells"]
CONFIG = load_config(CELLS_DIR / "queues.yml")
PROMETHEUS = load_yaml(CELLS_DIR / "prometheus.yml")


def _cell_settings(service: dict[str, Any]) -> Any:
    """The service's settings, its cells file read from the repository."""
    found = settings(service)
    assert found.cells_file == Path(CONTAINER_CELLS_DIR) / "cells.yml"
    return dataclasses.replace(found, cells_file=CELLS_DIR / "cells.yml")


def _pools() -> dict[str, tuple[str, LaneName, dict[str, Any]]]:
    """Each worker pool: (cell, lane, service)."""
    pools = {}
    for name, service in SERVICES.items():
        line = command(service)
        if line[:3] == ["celery", "-A", "workers.interactive"]:
            lane = LaneName.INTERACTIVE
        elif line[:3] == ["celery", "-A", "workers.batch"]:
            lane = LaneName.BATCH
        else:
            continue
        pools[name] = (environment(service).get("DATASERVICE_CELL", ""), lane, service)
    return pools


def test_the_cells_queues_yml_is_the_repositorys_with_the_cells_and_their_replicas() -> None:
    shipped = yaml.safe_load((ROOT / "queues.yml").read_text())
    cells = yaml.safe_load((CELLS_DIR / "queues.yml").read_text())
    assert cells["cells"]["names"] == sorted(CELLS_FILE)
    shipped["cells"]["names"] = cells["cells"]["names"]
    shipped["budget"]["max_replicas"] = cells["budget"]["max_replicas"]
    assert cells == shipped


def test_every_cell_has_a_pool_per_lane_and_each_pool_serves_its_cells_redis() -> None:
    pools = _pools()
    assert {(cell, lane) for cell, lane, _ in pools.values()} == {
        (cell, lane) for cell in CELLS_FILE for lane in LaneName
    }
    for cell, _, service in pools.values():
        own = _cell_settings(service).for_worker(CONFIG)
        assert own.redis_url == own.broker_url == CELLS_FILE[cell]["redis_url"]
        # Its own hostname: Celery's node names stay unique across cells.
        assert "--hostname" in command(service)


def test_the_budget_holds_three_cells_and_a_rolling_deploy_in_each() -> None:
    check = check_budget(CONFIG)
    assert check.ok, check.problems
    pools = _pools()
    for cell in CELLS_FILE:
        for lane in LaneName:
            alive = sum(
                s.get("deploy", {}).get("replicas", 1)
                for c, found, s in pools.values()
                if c == cell and found is lane
            )
            assert alive * ROLLING_OVERLAP <= CONFIG.budget.max_replicas
    connections = sum(
        service.get("deploy", {}).get("replicas", 1)
        * process_share(CONFIG.lanes[lane]).connections
        * ROLLING_OVERLAP
        for _, lane, service in pools.values()
    )
    consumers = SERVICES["changes"]["deploy"]["replicas"] * CONSUMER_CONNECTIONS
    total = connections + consumers + RESERVED_CONNECTIONS
    assert total <= int(server_options(SERVICES["mariadb"])["max_connections"])


def test_cell_a_is_a_primary_three_sentinels_watch_with_a_quorum_of_two() -> None:
    target = SentinelTarget.parse(CELLS_FILE["a"]["redis_url"])
    sentinels = [name for name in SERVICES if name.startswith("sentinel-")]
    assert sorted(host for host, _ in target.sentinels) == sorted(sentinels)
    assert len(sentinels) == 3
    for name in sentinels:
        script = command(SERVICES[name])[-1]
        assert f"'sentinel monitor {target.primary} redis 6379 2'" in script
        assert "'sentinel resolve-hostnames yes'" in script
    replica = command(SERVICES["redis-a-replica"])
    assert replica[replica.index("--replicaof") + 1 :][:2] == ["redis", "6379"]


def test_the_consumer_keeps_every_cell_and_picks_none() -> None:
    consumer = SERVICES["changes"]
    env = environment(consumer)
    assert "DATASERVICE_CELL" not in env
    own = _cell_settings(consumer)
    assert SentinelTarget.parse(own.redis_url).primary == "cell-a"
    for name in ("redis-b", "redis-c", "sentinel-1"):
        assert consumer["depends_on"][name] == {"condition": "service_healthy"}


@pytest.mark.parametrize("name", sorted(OVERLAY["services"]))
def test_nothing_new_is_published_off_loopback(name: str) -> None:
    assert all(host == "127.0.0.1" for host, _ in published_ports(SERVICES[name]))


def test_every_new_volume_is_declared() -> None:
    used = {
        str(v).split(":")[0]
        for name in OVERLAY["services"]
        for v in SERVICES[name].get("volumes", [])
        if isinstance(v, str)
    }
    assert used <= set(OVERLAY["volumes"]) | set(COMPOSE["volumes"])


# Monitoring --------------------------------------------------------------------


def _relabelled(job: dict[str, Any], labels: dict[str, str]) -> dict[str, str]:
    """``labels`` after the job's relabelling, as Prometheus applies its
    default action (replace): each rule in turn, its regex anchored, ``$1``
    by default."""
    result = dict(labels)
    for rule in job.get("relabel_configs") or []:
        value = ";".join(result.get(name, "") for name in rule["source_labels"])
        found = re.fullmatch(rule["regex"], value)
        if found is not None:
            replacement = rule.get("replacement", "$1")
            # Prometheus's $1 is Python's \1.
            result[rule["target_label"]] = found.expand(re.sub(r"\$(\d+)", r"\\\1", replacement))
    return result


def _jobs() -> dict[str, dict[str, Any]]:
    return {job["job_name"]: job for job in PROMETHEUS["scrape_configs"]}


def _flowers() -> dict[str, str]:
    """Each Flower service and the cell it watches."""
    return {
        name: environment(service).get("DATASERVICE_CELL", "")
        for name, service in SERVICES.items()
        if command(service)[:2] == ["dataservice", "flower"]
    }


def test_prometheus_reads_the_cells_file() -> None:
    mounts = {target: source for source, target, _ in bind_mounts(SERVICES["prometheus"])}
    assert mounts["/etc/prometheus/prometheus.yml"] == CELLS_DIR / "prometheus.yml"


def test_prometheus_scrapes_every_pool_of_every_cell_under_its_cell() -> None:
    pools = _pools()
    scraped = []
    for name, service in SERVICES.items():
        line = command(service)
        if line[:1] not in (["dataservice"], ["celery"]):
            continue
        _, params = parse(line)
        if not params.get("metrics_port"):
            continue
        found = [
            (job, sd)
            for job in _jobs().values()
            for sd in job.get("dns_sd_configs") or []
            if sd.get("names") == [name]
        ]
        assert len(found) == 1, f"{name}: one dns_sd_configs entry expected, found {found}"
        job, sd = found[0]
        assert (sd["type"], sd["port"]) == ("A", params["metrics_port"])
        cell = _relabelled(job, {"__meta_dns_name": name}).get("cell")
        assert cell == (pools[name][0] if name in pools else None), name
        scraped.append(name)
    assert set(pools) <= set(scraped)
    assert "changes" in scraped


def test_a_flower_per_cell_each_on_its_cells_broker_and_scraped_under_its_cell() -> None:
    flowers = _flowers()
    assert sorted(flowers.values()) == sorted(CELLS_FILE)
    host_ports = []
    for name, cell in flowers.items():
        own = _cell_settings(SERVICES[name]).for_worker(CONFIG)
        assert own.broker_url == CELLS_FILE[cell]["redis_url"]
        assert settings(SERVICES[name]).flower_auth is not None
        assert published_ports(SERVICES[name]) == [("127.0.0.1", "5555")]
        host_ports += [str(p).rsplit(":", 2)[1] for p in SERVICES[name]["ports"]]
    assert len(set(host_ports)) == len(flowers), host_ports
    (flower_job,) = [job for job in _jobs().values() if job.get("static_configs")]
    labelled = {
        target: static.get("labels", {}).get("cell")
        for static in flower_job["static_configs"]
        for target in static["targets"]
    }
    assert labelled == {f"{name}:5555": cell for name, cell in flowers.items()}
