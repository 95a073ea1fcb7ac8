"""The batch bench's stock baseline: a Celery task doing the service's upsert.

The same stock app as :mod:`bench.baselines.noop` (Redis broker and result backend,
threads pool, prefetch 1, late acknowledgement), with one task that writes a
record with the service's own statement (``dataservice.store.statements.UPSERT``)
on a pool of as many connections as threads, in autocommit: what a team
writing its own Celery task for the job would run.

Run the worker with ``python -m bench.baselines.upsert --url redis://... --concurrency N
--database-url mysql+mysqldb://...``.
"""

from __future__ import annotations

import argparse
import base64
from typing import Any

from celery import Celery
from sqlalchemy import Engine, create_engine

from bench.baselines import noop
from dataservice.store.statements import UPSERT

UPSERT_TASK = "bench.upsert"
_ENGINE: dict[str, Engine] = {}


def upsert(scope: str, object_id: str, payload_b64: str) -> int:
    """Create or replace the record; its new revision."""
    engine = _ENGINE["engine"]
    params = {"scope": scope, "object_id": object_id, "payload": base64.b64decode(payload_b64)}
    with engine.connect() as conn:
        result = conn.execute(UPSERT, params)
    return 1 if result.rowcount == 1 else int(result.lastrowid)


def make_app(url: str) -> Celery:
    app = noop.make_app(url)
    app.task(name=UPSERT_TASK)(upsert)
    return app


def upsert_args(scope: str, object_id: str, payload: bytes) -> tuple[Any, ...]:
    """The task's arguments for one write (JSON carries bytes as base64)."""
    return scope, object_id, base64.b64encode(payload).decode("ascii")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.baselines.upsert", description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--loglevel", default="INFO")
    args = parser.parse_args(argv)
    _ENGINE["engine"] = create_engine(
        args.database_url,
        pool_size=args.concurrency,
        max_overflow=0,
        isolation_level="AUTOCOMMIT",
    )
    noop.serve(make_app(args.url), args.concurrency, args.loglevel)


if __name__ == "__main__":
    main()
