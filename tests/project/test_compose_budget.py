"""compose/docker-compose.yml stays within the database budget: its replicas,
a rolling deploy's overlap included, pass ``dataservice check-config``'s
arithmetic, and every connection they can open, plus a reserve, fits under
MariaDB's ``--max-connections``. compose/README.md explains the same sums.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dataservice.config.budget import check_budget, pool_size, process_share
from dataservice.config.model import Config
from dataservice.enums import LaneName
from tests.harness.compose_file import (
    SERVICES,
    built_from_project,
    is_change_consumer,
    is_lane_worker,
    mounted_config,
    replicas,
    server_options,
    worker_lane,
    worker_threads,
)

# Database connections kept free for everything that is not a pool: the
# one-shot jobs, health checks, operators' sessions, other clients.
RESERVED_CONNECTIONS = 20
# A rolling deploy that starts each new replica before its old one stops runs,
# for a while, a second set of every pool: the sums count each replica twice.
# (Compose's own `up` stops the old container first, which needs no overlap.)
ROLLING_OVERLAP = 2
# What one change consumer holds at most: its positions' pool (1), the lag
# probe's (1), and the binlog reader's stream and control connections (2).
CONSUMER_CONNECTIONS = 4


def _workers() -> Iterator[tuple[str, dict[str, Any], LaneName, int]]:
    """(name, service, lane, threads) of each worker pool."""
    for name, service in SERVICES.items():
        if built_from_project(service) and is_lane_worker(service):
            yield name, service, worker_lane(service), worker_threads(service)


def _consumers() -> Iterator[tuple[str, dict[str, Any]]]:
    for name, service in SERVICES.items():
        if built_from_project(service) and is_change_consumer(service):
            yield name, service


def _max_connections() -> int:
    options = server_options(SERVICES["mariadb"])
    assert "max_connections" in options, "mariadb must set --max-connections explicitly"
    return int(options["max_connections"])


def _config() -> Config:
    configs = {name: mounted_config(service) for name, service, _, _ in _workers()}
    assert configs, "no worker service found"
    first = next(iter(configs.values()))
    assert all(config == first for config in configs.values()), "the pools read other configs"
    return first


def test_the_configuration_compose_mounts_passes_check_config() -> None:
    check = check_budget(_config())
    assert check.ok, "; ".join(check.problems)


@pytest.mark.parametrize("lane", list(LaneName))
def test_each_lanes_replicas_with_a_rolling_overlap_stay_within_budget_max_replicas(
    lane: LaneName,
) -> None:
    budget = _config().budget
    alive = sum(replicas(service) for _, service, found, _ in _workers() if found is lane)
    assert alive >= 1, f"no pool consumes {lane.value}"
    assert alive * ROLLING_OVERLAP <= budget.max_replicas, (
        f"{lane.value}: {alive} replicas x {ROLLING_OVERLAP} during a rolling deploy "
        f"> budget.max_replicas {budget.max_replicas}"
    )


def test_the_permits_all_replicas_hold_during_a_rolling_deploy_fit_the_service_share() -> None:
    config = _config()
    budget = config.budget
    # A process's permits and its administrative statement.
    held = sum(
        replicas(service) * ROLLING_OVERLAP * process_share(config.lanes[lane], threads).active
        for _, service, lane, threads in _workers()
    )
    share = budget.database_active - budget.reserved
    assert held <= share, f"{held} permits > {budget.database_active} - {budget.reserved}"


def test_every_pool_connects_within_its_lanes_permits() -> None:
    """Threads may exceed a lane's permits; its connections never do."""
    config = _config()
    for name, _, lane, threads in _workers():
        assert threads >= 1, f"{name}: no thread"
        assert pool_size(threads, config.lanes[lane].permits) <= config.lanes[lane].permits


def _connections(lane: LaneName, threads: int) -> int:
    """A replica's database connections: one per thread, up to its lane's
    permits, and its administrative connection."""
    return process_share(_config().lanes[lane], threads).connections


def test_connections_with_a_rolling_overlap_plus_the_reserve_fit_mariadb_max_connections() -> None:
    used = 0
    breakdown = []
    for name, service, lane, threads in _workers():
        # The pool never overflows (one connection per thread, up to the
        # permits), and the administrative connection.
        conns = _connections(lane, threads)
        used += replicas(service) * ROLLING_OVERLAP * conns
        breakdown.append(f"{name}: {replicas(service)} x {ROLLING_OVERLAP} x {conns}")
    consumers = list(_consumers())
    assert consumers, "no change consumer found"
    for name, service in consumers:
        used += replicas(service) * ROLLING_OVERLAP * CONSUMER_CONNECTIONS
        breakdown.append(
            f"{name}: {replicas(service)} x {ROLLING_OVERLAP} x {CONSUMER_CONNECTIONS}"
        )
    total = used + RESERVED_CONNECTIONS
    assert total <= _max_connections(), (
        f"{' + '.join(breakdown)} + reserve {RESERVED_CONNECTIONS} = {total} "
        f"exceeds max_connections {_max_connections()}"
    )


def test_the_services_connections_during_a_rolling_deploy_fit_budget_max_connections() -> None:
    budget = _config().budget
    pools = sum(
        replicas(s) * ROLLING_OVERLAP * _connections(lane, threads)
        for _, s, lane, threads in _workers()
    )
    consumers = sum(replicas(s) * ROLLING_OVERLAP * CONSUMER_CONNECTIONS for _, s in _consumers())
    assert pools + consumers <= budget.max_connections


def test_mariadb_holds_the_whole_service_connection_budget_plus_the_reserve() -> None:
    budget = _config().budget
    assert budget.max_connections + RESERVED_CONNECTIONS <= _max_connections()
