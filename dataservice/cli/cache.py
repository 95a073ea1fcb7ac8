"""``dataservice cache``: the read cache's rollout controls (``docs/cache.md``).

Each change prints what it changed, before -> after, and who made it (the OS
user, which the audit stream records too). The controls live in the Redis of
``DATASERVICE_REDIS_URL``; one that does not answer exits 1, a bad value 2.
"""

from __future__ import annotations

import getpass
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from enum import StrEnum

import typer
from redis.backoff import NoBackoff
from redis.retry import Retry

from dataservice.cache.controls import RolloutControls
from dataservice.cache.guard import stream_status
from dataservice.cache.rollout import AuditEntry, Change, Rollout, parse_format, parse_formats
from dataservice.cache.shadow import describe_counts, read_counts
from dataservice.changes.behind import describe_events, describe_lag
from dataservice.cli.common import fail, load
from dataservice.errors import DataServiceError, InvalidControl
from dataservice.redis import endpoints
from dataservice.redis.keys import CHANGES_FRESH_KEY, ROLLOUT_KEY

app = typer.Typer(no_args_is_help=True, help="The read cache's rollout controls (docs/cache.md).")

HISTORY = 10


class Switch(StrEnum):
    ON = "on"
    OFF = "off"


@contextmanager
def _controls() -> Iterator[RolloutControls]:
    """The controls in the configured Redis; a failure exits with its error, no traceback."""
    # Imported here: dataservice.cli imports this module to register its commands.

    settings, config = load()
    # No retries: a change is not idempotent (a rotation retried after a lost
    # reply would rotate twice), and a Redis that does not answer should say so now.
    client = endpoints.client(
        settings.redis_url,
        socket_connect_timeout=2,
        socket_timeout=5,
        retry=Retry(NoBackoff(), retries=0),
    )
    try:
        yield RolloutControls(client, config.cache)
    except InvalidControl as exc:
        raise fail(exc, 2) from None
    except DataServiceError as exc:
        raise fail(exc, 1) from None
    finally:
        client.close()


def _guard(stream: dict[str, str] | None, fresh: bool) -> str:
    """The freshness guard as the workers see it (docs/changes.md)."""

    _, config = load()
    if not config.changes.guard:
        return "off (changes.guard: false): the cache is read without a change consumer"
    if stream is None:
        return "ENGAGED: no change consumer has reported; ALLOW_CACHED reads go to the database"
    lag = float(stream.get("lag_s", "0"))
    where = f"{stream.get('log_file', '?')}:{stream.get('log_pos', '?')}"
    behind = _behind(stream)
    if not fresh:
        return (
            f"ENGAGED: the change stream lags {describe_lag(lag)} ({behind}) at {where}; "
            "reads go to the database"
        )
    token = stream.get("token")
    return (
        f"off: the change stream is {describe_lag(lag)} ({behind}) behind at {where} "
        f"(token {token})"
    )


def _behind(stream: dict[str, str]) -> str:
    """Events and bytes behind the server, as the consumer last counted them."""
    events = int(stream.get("lag_events", "-1"))
    size = int(stream.get("lag_bytes", "-1"))
    return describe_events(events) + (f", {size:,} bytes" if size >= 0 else "")


def _who() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        # No login name in the environment and no passwd entry (some containers).
        return f"uid {os.getuid()}"


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _diff(before: Rollout, after: Rollout) -> str:
    old, new = before.describe(), after.describe()
    changed = [f"{name}: {old[name]} -> {new[name]}" for name in old if old[name] != new[name]]
    return ", ".join(changed) or f"unchanged ({after})"


def _warnings(rollout: Rollout) -> list[str]:
    if rollout.read is not None and rollout.reads_unfilled:
        return [
            f"reads look in {rollout.read.value}, which no fill writes: they miss until "
            f"`dataservice cache fill` includes it (or `dataservice cache read` moves them)"
        ]
    return []


def _report(change: Change, who: str) -> None:
    typer.echo(f"{_diff(change.before, change.after)} (by {who})")
    for warning in _warnings(change.after):
        typer.echo(f"warning: {warning}", err=True)


def _as_json(rollout: Rollout) -> dict[str, object]:
    return {
        "fill": sorted(f.value for f in rollout.fill),
        "read": rollout.read.value if rollout.read is not None else None,
        "percent": rollout.percent,
        "bypass": rollout.bypass,
        "shadow": rollout.shadow,
        "generation": rollout.generation,
        "rotated_at_ms": rollout.rotated_at_ms,
        "source": rollout.source,
    }


def _entry_as_json(entry: AuditEntry) -> dict[str, object]:
    return {
        "id": entry.id,
        "at_ms": entry.at_ms,
        "who": entry.who,
        "action": entry.action,
        "before": _as_json(entry.before),
        "after": _as_json(entry.after),
    }


@app.command("status")
def status(
    as_json: bool = typer.Option(False, "--json", help="One JSON object, for machines."),
) -> None:
    """The controls, where they come from, the generation, and the last changes."""
    with _controls() as controls:
        rollout = controls.fetch()
        entries = controls.history(HISTORY)
        stream = stream_status(controls.client)
        fresh = bool(controls.client.exists(CHANGES_FRESH_KEY))
        counts = read_counts(controls.client)
    guard = _guard(stream, fresh)
    warnings = _warnings(rollout)
    if as_json:
        document = {
            "controls": _as_json(rollout),
            "change_stream": stream,
            "freshness_guard": guard,
            "warnings": warnings,
            "shadow": {"percent": rollout.shadow, "counts": counts},
            "history": [_entry_as_json(entry) for entry in entries],
        }
        typer.echo(json.dumps(document, indent=2))
        return
    if rollout.source == "redis":
        typer.echo(f"rollout controls (from Redis, {ROLLOUT_KEY}):")
    else:
        typer.echo("rollout controls (queues.yml's cache.rollout: nothing in Redis yet):")
    shown = rollout.describe()
    rotated = _when(rollout.rotated_at_ms) if rollout.rotated_at_ms else "never"
    shown["generation"] += f" (last rotated: {rotated})"
    for name, value in shown.items():
        typer.echo(f"  {name:<11} {value}")
    if rollout.bypass:
        typer.echo("  bypass is on: reads go to the database; no cache reads, no fills")
    typer.echo(f"freshness guard: {guard}")
    if rollout.shadow or counts:
        typer.echo(
            f"shadow comparisons ({rollout.shadow} % of hits; since the control last changed):"
        )
        for line in describe_counts(counts):
            typer.echo(f"  {line}")
    for warning in warnings:
        typer.echo(f"warning: {warning}", err=True)
    typer.echo(f"last {HISTORY} changes, newest first:" if entries else "no changes yet")
    for entry in entries:
        change = _diff(entry.before, entry.after)
        typer.echo(f"  {_when(entry.at_ms)}  {entry.who}  {entry.action}: {change}")


@app.command("fill")
def fill(
    formats: str = typer.Argument(..., metavar="v1,v2|v1|v2|none", help="Formats to fill."),
) -> None:
    """Set the formats a database read writes into the cache (none: stop fills)."""
    who = _who()
    with _controls() as controls:
        _report(controls.change(who, fill=parse_formats(formats)), who)


@app.command("read")
def read(
    fmt: str = typer.Argument(..., metavar="v1|v2|none", help="The format reads look in."),
    percent: int | None = typer.Option(
        None,
        help="Of ALLOW_CACHED reads that look in the cache: 1, 10, 25, 50, 75 or 100 "
        "(default: unchanged).",
    ),
) -> None:
    """Set the format ALLOW_CACHED reads look in (none: no cache reads), and their share."""
    who = _who()
    with _controls() as controls:
        _report(controls.change(who, read=parse_format(fmt), percent=percent), who)


@app.command("bypass")
def bypass(
    switch: Switch = typer.Argument(
        ..., metavar="on|off", help="on: every read goes to the database."
    ),
) -> None:
    """Send every read to the database (no cache reads, no fills), or stop doing so."""
    who = _who()
    with _controls() as controls:
        _report(controls.change(who, bypass=switch is Switch.ON), who)


@app.command("shadow")
def shadow(
    percent: int = typer.Argument(
        ..., metavar="0|1|10|25|50|75|100", help="Of ALLOW_CACHED hits; 0: none."
    ),
) -> None:
    """Compare this share of cache hits with the database (and the other format)."""
    who = _who()
    with _controls() as controls:
        _report(controls.change(who, shadow=percent), who)


@app.command("rotate")
def rotate() -> None:
    """Start the next namespace generation: every entry cached so far becomes unreachable."""
    who = _who()
    with _controls() as controls:
        _report(controls.rotate(who), who)
