"""A FastAPI service that reads records through the data service.

    RECORDS_CALLER=web uvicorn examples.fastapi_app:app

The app holds one :class:`~dataservice.AsyncClient` for its whole life: every
request's read goes out on it, and every answer comes back on its one reply
channel, however many requests are in flight. A request may say how long it
will wait (``X-Request-Timeout``, seconds); that becomes its read's deadline.
The service's errors become HTTP statuses: ``NotFound`` 404,
``DeadlineExceeded`` 504, ``ResourceExhausted`` and ``Unavailable`` 503 with
``Retry-After``.

The client reads ``DATASERVICE_*`` (the broker, the result backend, the
callers file with this caller's key) as every part of the service does.
"""

from __future__ import annotations

import math
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import FastAPI, Header, Request, Response
from fastapi.responses import JSONResponse

from dataservice import (
    AsyncClient,
    DataServiceError,
    DeadlineExceeded,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    RetryableError,
)

# The caller this app is, named in queues.yml, its key in the callers file.
CALLER = os.environ.get("RECORDS_CALLER", "demo")
# A request that says nothing waits this long; one that asks for more is
# capped by the service at its interactive lane's longest deadline.
DEFAULT_TIMEOUT_S = 2.0

# The first that matches; anything else is the service failing us (502).
STATUSES: list[tuple[type[DataServiceError], int]] = [
    (NotFound, 404),
    (InvalidArgument, 400),
    (PermissionDenied, 403),
    (DeadlineExceeded, 504),
    (RetryableError, 503),  # ResourceExhausted, Unavailable, RequestLost
]


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with AsyncClient.from_env(CALLER) as client:
        app.state.records = client
        yield


app = FastAPI(lifespan=lifespan)


@app.get("/records/{scope}/{object_id}")
async def read_record(
    scope: str,
    object_id: str,
    request: Request,
    x_request_timeout: Annotated[float | None, Header(gt=0, le=60)] = None,
) -> Response:
    client: AsyncClient = request.app.state.records
    record = await client.read(scope, object_id, timeout=x_request_timeout or DEFAULT_TIMEOUT_S)
    return Response(
        record.payload,
        media_type="application/octet-stream",
        headers={"ETag": f'"{record.revision}"'},
    )


@app.exception_handler(DataServiceError)
async def service_error(request: Request, error: Exception) -> JSONResponse:
    status = next((code for kind, code in STATUSES if isinstance(error, kind)), 502)
    headers = {}
    if isinstance(error, RetryableError):
        # Whole seconds (RFC 9110), never 0: "now" would invite a stampede.
        headers["Retry-After"] = str(max(1, math.ceil(error.retry_after)))
    body = {"error": type(error).__name__, "reason": getattr(error, "reason", "")}
    return JSONResponse(body, status_code=status, headers=headers)
