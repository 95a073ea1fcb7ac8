"""The worker's books as ``dataservice/compat/celery.py`` uses them for the
lean path: what Celery's ``inspect active`` and a cold shutdown read of a
listed request, pinned against Celery itself (no broker needed)."""

from __future__ import annotations

import inspect
import re
import types

from celery import Celery
from celery.worker import control
from celery.worker.consumer import Consumer
from celery.worker.request import Request

from dataservice.compat import celery as celery_compat

HEADERS = {"id": "lean-1", "task": "compat.lean", "argsrepr": "<RequestEnvelope 9 bytes>"}
DELIVERY = {"exchange": "interactive", "routing_key": "interactive", "redelivered": False}


def _listed() -> tuple[Celery, celery_compat.LeanRequest]:
    app = Celery("compat-lean", set_as_current=False)

    @app.task(name="compat.lean", shared=False, acks_late=True)
    def lean() -> None:
        pass

    return app, celery_compat.LeanRequest(lean, HEADERS, DELIVERY, "lean@tests")


def test_inspect_active_lists_a_lean_request_as_celery_lists_its_own() -> None:
    app, request = _listed()
    state = types.SimpleNamespace(tset=set, app=app)
    celery_compat.list_active(request)
    try:
        (shown,) = [i for i in control.active(state) if i["id"] == "lean-1"]
        assert control.active(state, safe=True) == control.active(state)
        assert not [i for i in control.reserved(state) if i["id"] == "lean-1"]
    finally:
        celery_compat.unlist(request)
    assert not [i for i in control.active(state) if i["id"] == "lean-1"]
    keys = re.findall(r"'(\w+)':", inspect.getsource(Request.info))
    assert list(shown) == keys
    assert (shown["name"], shown["type"], shown["args"]) == (
        "compat.lean",
        "compat.lean",
        "<RequestEnvelope 9 bytes>",
    )
    assert shown["delivery_info"]["routing_key"] == "interactive"
    app.close()


def test_a_cold_shutdown_cancels_a_listed_lean_request_without_failing() -> None:
    """Celery cancels every listed late-acknowledged request not yet
    acknowledged (reading ``task.acks_late``, ``acknowledged``, ``id``);
    ours does nothing: a thread cannot be stopped."""
    app, request = _listed()
    assert request.task.acks_late
    assert not request.acknowledged
    celery_compat.list_active(request)
    try:
        Consumer.cancel_active_requests(types.SimpleNamespace(pool=None))
    finally:
        celery_compat.unlist(request)
    assert "request.cancel(self.pool, emit_retry=emit_retry)" in inspect.getsource(
        Consumer.cancel_active_requests
    )
    # The events step sets it on every reserved request after a reconnect.
    request.eventer = object()
    app.close()
