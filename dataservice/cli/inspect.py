"""``dataservice inspect queue|cache``: what waits in a lane, what the cache
holds for a record (:mod:`dataservice.ops.inspect`). Neither prints a payload
byte unless ``--show-payload`` is given by someone who can read the callers
file, the same people who could sign such a request themselves."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

import redis
import typer
from redis.backoff import NoBackoff
from redis.retry import Retry

from dataservice.cli.common import load
from dataservice.enums import LaneName
from dataservice.errors import DataServiceError
from dataservice.redis import endpoints

app = typer.Typer(no_args_is_help=True, help="Look inside the queues and the cache, read-only.")

# At most this much of a payload is shown, even with --show-payload.
PAYLOAD_SHOWN = 64


@contextmanager
def _redis(url: str, what: str) -> Iterator[redis.Redis]:
    """A client for ``url``; a Redis error exits 1 naming ``what`` failed, no traceback."""
    client = endpoints.client(
        url, socket_timeout=5, socket_connect_timeout=2, retry=Retry(NoBackoff(), 0)
    )
    try:
        yield client
    except redis.RedisError as exc:
        typer.echo(f"error: {what}: {type(exc).__name__}: {exc}", err=True)
        raise typer.Exit(1) from None
    except DataServiceError as exc:  # the rollout controls say which Redis failed
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    finally:
        client.close()


def _may_show_payload() -> None:

    settings, _ = load()
    path = settings.callers_file
    try:
        if path is None:
            raise OSError("DATASERVICE_CALLERS_FILE is not set")
        with path.open("rb") as handle:
            handle.read(1)
    except OSError as exc:
        typer.echo(
            "error: --show-payload is for those who can read the callers file "
            f"(DATASERVICE_CALLERS_FILE): {exc.strerror or exc}",
            err=True,
        )
        raise typer.Exit(2) from None


def _ms(value: int | None) -> str:
    return "-" if value is None else f"{value / 1000:.1f} s"


@app.command("queue")
def queue(
    lane: LaneName = typer.Argument(..., help="interactive or batch."),
    limit: int = typer.Option(20, min=1, max=10_000, help="Messages shown, oldest first."),
    show_payload: bool = typer.Option(
        False, "--show-payload", help="Also record ids and payloads (callers-file readers only)."
    ),
    as_json: bool = typer.Option(False, "--json", help="One JSON object, for machines."),
) -> None:
    """The messages waiting in LANE's queue, decoded, none taken from it."""
    from dataservice.broker import broker_for
    from dataservice.ops.inspect import decoded

    if show_payload:
        _may_show_payload()
    settings, config = load()
    queue_name = config.lanes[lane].queue
    broker = broker_for(settings)
    try:
        peek = broker.peek(queue_name, limit)
    except broker.errors as exc:
        typer.echo(f"error: the broker: {type(exc).__name__}: {exc}", err=True)
        raise typer.Exit(1) from None
    if peek.entries is None:
        _counted(queue_name, peek.total, broker.name, as_json)
        return
    total, found = peek.total, decoded(peek.entries, payload=show_payload)
    if as_json:
        rows = [_as_json(item) for item in found]
        typer.echo(json.dumps({"queue": queue_name, "waiting": total, "shown": rows}, indent=2))
        return
    typer.echo(f"{queue_name}: {total} waiting; the oldest {len(found)}:")
    for item in found:
        line = (
            f"  #{item.position} {item.operation} caller={item.caller} scope={item.scope} "
            f"envelope={item.envelope_bytes} B payload={item.payload_bytes} B "
            f"deadline in {_ms(item.deadline_left_ms)} age {_ms(item.age_ms)} "
            f"request={item.request_id}"
        )
        if item.payload is not None:
            shown = item.payload[:PAYLOAD_SHOWN]
            more = "..." if len(item.payload) > PAYLOAD_SHOWN else ""
            line += f"\n      object_id={item.object_id} payload={shown!r}{more}"
        typer.echo(line)


def _counted(queue_name: str, total: int, broker: str, as_json: bool) -> None:
    """A broker that shows a message only by delivering it (RabbitMQ: even
    handed back, it would come to a worker marked redelivered, its delivery
    count raised, and no worker could take it meanwhile) is counted, not read."""
    if as_json:
        typer.echo(json.dumps({"queue": queue_name, "waiting": total, "shown": []}, indent=2))
        return
    typer.echo(
        f"{queue_name}: {total} waiting ({broker}: counted, not shown; "
        "a message is seen only by taking it from the queue)"
    )


def _as_json(item: Any) -> dict[str, Any]:
    document = asdict(item)
    if document["payload"] is None:
        del document["payload"], document["object_id"]
    else:
        document["payload"] = document["payload"][:PAYLOAD_SHOWN].hex()
    return document


@app.command("cache")
def cache(
    scope: str = typer.Argument(..., help="The record's scope."),
    object_id: str = typer.Argument(..., help="The record's id."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object, for machines."),
) -> None:
    """A record's cache entries in both formats and the live generations, and its tombstone."""
    from dataservice.cache.controls import RolloutControls
    from dataservice.identifiers import OBJECT_ID_RE, SCOPE_RE
    from dataservice.ops.inspect import cached

    settings, config = load()
    for name, value, pattern in (("scope", scope, SCOPE_RE), ("id", object_id, OBJECT_ID_RE)):
        if not pattern.fullmatch(value):
            typer.echo(f"error: {value!r} is not a valid {name} ({pattern.pattern})", err=True)
            raise typer.Exit(2)
    with _redis(settings.redis_url, "the cache's Redis") as client:
        generation = RolloutControls(client, config.cache).fetch().generation
        entries = cached(client, scope, object_id, generation)
    if as_json:
        rows = [asdict(entry) for entry in entries]
        typer.echo(json.dumps({"generation": generation, "entries": rows}, indent=2))
        return
    typer.echo(f"generation {generation} (replicas read it; one either side may still be filled)")
    for entry in entries:
        state = "absent" if entry.revision is None else f"revision {entry.revision}"
        ttl = "" if entry.ttl_ms is None else f", expires in {entry.ttl_ms / 1000:.1f} s"
        size = f", {entry.size} B" if entry.revision is not None else ""
        typer.echo(f"  {entry.format:<9} gen {entry.generation}: {state}{size}{ttl}  {entry.key}")
