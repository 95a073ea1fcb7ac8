"""Custody: a connection the process let go of counts until the server has too.

A driver read timeout, a lost connection or a discarded connection ends the
process's side of a connection at once, but not the server's: a stalled
server resumes with the statement still running, and a connection closed by
the client stays in the server's process list until the server reads the
close. Freeing the statement's permit, or opening a new connection in the
slot, on the client's word alone lets the service hold more than its share
for as long as the server takes to notice (a stall longer than the read
timeout ended with every replica's statements still running beside their
replacements). So the server's word decides:

- **Custody.** Every connection the pool closes, for whatever reason
  (invalidated after an error, recycled, discarded at checkout), is taken
  into custody by its server-side id (:meth:`Custody.discarded`). When a
  statement may still be running on it (the connection was lost before the
  server answered), the statement's permit goes into custody with it
  (:meth:`Custody.abandon`): it stays taken.
- **Confirmation.** A thread of the process's own confirms each one on the
  process's **administrative connection** (one per process, counted in the
  budget: :data:`dataservice.config.budget.ADMIN_CONNECTIONS`): it reads the
  process list until the id is gone, and ``KILL``s a connection still there
  a moment after the server answers (a statement ends by itself within its
  server-side timeout; the KILL only shortens that). Only then is the permit
  given back.
- **The gate.** While anything is in custody, the process opens no new
  connection (:meth:`Custody.wait_clear`, before the reconnect ramp): the
  server never holds a replacement beside what it replaces. A request waits
  for the gate no longer than it could still use a connection
  (``connections.CONNECT_BY``), then is refused
  (:class:`~dataservice.store.connections.ConnectionsInDoubt`, answered as
  the reconnect ramp's refusal is).

The administrative connection has no read timeout: a look at the process
list sent to a stopped server waits until the server runs again. It is
bounded instead by TCP itself (:data:`dataservice.tcp.KEEPALIVE`): a server
host that is gone, or cut off, ends it with an error; then it is in custody
itself (the server may still hold it, if only the path broke), and a new one
is opened through the process's reconnect ramp to confirm it. Idle, it is
pinged every ``pool_recycle_s``, so that it is alive when a stall needs it.

A thread id means something only on one server in one of its lives, so each
connection records its :class:`Origin` (the server's host and port, and when
it started) as it is made (:func:`identify`). A connection from an earlier
life of the administrative connection's server is gone (a restart ended its
statements; ids start again after one), without a look or a KILL. One made
to another server (behind a proxy, or an address that moved) custody cannot
see: it is taken as gone once its statement's server-side timeout has
certainly passed, and never KILLed.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from weakref import WeakKeyDictionary

from dataservice.tcp import keep_alive

log = logging.getLogger(__name__)

# A connection's id and origin, in its pool record's info (connections.py).
CONNECTION_ID = "dataservice.connection_id"
ORIGIN = "dataservice.origin"
# Uptime is reported in whole seconds: boot times within this are one boot.
BOOT_TOLERANCE_S = 2.0
# A connection still in the process list this long after the server answered
# for it is KILLed; KILL takes effect at the killed thread's next check, so
# it is asked again this often. The list is read in growing steps meanwhile.
KILL_AFTER_S = 0.25
KILL_AGAIN_S = 1.0
_FIRST_LOOK_S = 0.001
_LONGEST_LOOK_S = 0.02
# After a failed administrative connect: the first wait, doubling to the last.
_RETRY_FIRST_S = 0.05
_RETRY_LAST_S = 0.25
_UNKNOWN_THREAD = 1094
_NOT_OWNER = 1095

_IDENTITY = "SELECT CONNECTION_ID(), @@hostname, @@port"
_UPTIME = "SHOW GLOBAL STATUS LIKE 'Uptime'"


# Each store engine's custody (connections.install attaches it).
_CUSTODY: WeakKeyDictionary[Any, Custody] = WeakKeyDictionary()


def attach(engine: Any, custody: Custody) -> None:
    _CUSTODY[engine] = custody


def custody_of(engine: Any) -> Custody | None:
    """The custody of a store engine (None for an engine made otherwise)."""
    return _CUSTODY.get(engine)


@dataclass(frozen=True, slots=True)
class Origin:
    """Which server, in which of its lives, a connection was made to: a
    thread id means something only there."""

    server: str  # host:port, as the server names itself
    boot_s: float  # when it started, on this process's monotonic clock

    def same_boot(self, other: Origin) -> bool:
        return self.server == other.server and abs(self.boot_s - other.boot_s) <= BOOT_TOLERANCE_S


def identify(dbapi_connection: Any) -> tuple[int, Origin]:
    """A new connection's server-side id and its origin (two short statements,
    once per connection)."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(_IDENTITY)
        connection_id, host, port = cursor.fetchone()
        cursor.execute(_UPTIME)
        uptime_s = float(cursor.fetchone()[1])
    finally:
        cursor.close()
    return int(connection_id), Origin(f"{host}:{port}", time.monotonic() - uptime_s)


def bound_by_tcp(dbapi_connection: Any) -> None:
    """TCP's own bound on a connection with no read timeout
    (:data:`dataservice.tcp.KEEPALIVE`)."""
    sock = socket.socket(fileno=socket.dup(dbapi_connection.fileno()))
    try:
        keep_alive(sock)
    finally:
        sock.close()


@dataclass(slots=True, eq=False)
class _Held:
    """One connection in custody, and the permits waiting on it."""

    connection_id: int
    origin: Origin | None
    since: float = field(default_factory=time.monotonic)
    releases: list[Callable[[], None]] = field(default_factory=list)
    # When a look at the process list first found it there, and when it was KILLed.
    listed_since: float | None = None
    killed_at: float | None = None
    # The server refused the KILL (not the connection's owner): wait for it instead.
    kill_refused: bool = False


@dataclass(frozen=True, slots=True)
class CustodySnapshot:
    held: int
    abandoned_total: int
    discarded_total: int
    killed_total: int
    admin_connects_total: int
    # The administrative connection's server-side id (None: not connected).
    admin_connection_id: int | None


class Custody:
    """One process's connections in custody, and the thread that confirms them.

    ``connect`` opens the administrative connection (a DB-API connection
    without a read timeout); ``before_connect`` is called before each attempt
    (the process's reconnect ramp, which may wait). ``ping_every_s``: an idle
    administrative connection is pinged this often, so that it is alive when
    needed. ``outlast_s``: how long a statement can run on a server custody
    cannot see (the server-side statement timeout, with some slack)."""

    def __init__(
        self,
        connect: Callable[[], Any],
        before_connect: Callable[[], None],
        *,
        ping_every_s: float,
        outlast_s: float,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._connect = connect
        self._before_connect = before_connect
        self._ping_every_s = ping_every_s
        self._outlast_s = outlast_s
        self._sleep = sleep
        self._cond = threading.Condition()
        self._held: dict[int, _Held] = {}
        self._closed = False
        self._thread: threading.Thread | None = None
        self._want_admin = False
        self._admin: Any = None
        self._admin_id: int | None = None
        self._admin_origin: Origin | None = None
        self._abandoned = 0
        self._discarded = 0
        self._killed = 0
        self._admin_connects = 0

    # -- what the pool and the sessions tell it --------------------------------

    def abandon(
        self, connection_id: int | None, origin: Origin | None, release: Callable[[], None] | None
    ) -> None:
        """A statement may still run on this connection: give the permit back
        (``release``) once the server confirms it is gone."""
        with self._cond:
            taken = connection_id is not None and not self._closed
            if taken:
                assert connection_id is not None
                self._abandoned += 1
                held = self._take(connection_id, origin)
                if release is not None:
                    held.releases.append(release)
        # Never identified (no request's statement was sent on it), or the
        # engine is disposed: nothing to wait for.
        if not taken and release is not None:
            release()

    def discarded(self, connection_id: int | None, origin: Origin | None) -> None:
        """The pool closed this connection: it counts until the server agrees."""
        with self._cond:
            if connection_id is None or self._closed:
                return
            self._discarded += 1
            self._take(connection_id, origin)

    def _take(self, connection_id: int, origin: Origin | None) -> _Held:
        held = self._held.get(connection_id)
        if held is None:
            held = self._held[connection_id] = _Held(connection_id, origin)
            self._cond.notify_all()
            self._ensure_thread()
        return held

    # -- the gate ----------------------------------------------------------------

    def wait_clear(self, timeout_s: float) -> bool:
        """Wait until nothing is in custody, at most ``timeout_s``; True if so."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        with self._cond:
            while self._held:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def snapshot(self) -> CustodySnapshot:
        with self._cond:
            return CustodySnapshot(
                held=len(self._held),
                abandoned_total=self._abandoned,
                discarded_total=self._discarded,
                killed_total=self._killed,
                admin_connects_total=self._admin_connects,
                admin_connection_id=self._admin_id,
            )

    def open_admin(self) -> None:
        """Open the administrative connection now, in the background, so that
        it is there before it is needed (when the server may not answer)."""
        with self._cond:
            if self._admin is None and not self._want_admin and not self._closed:
                self._want_admin = True
                self._ensure_thread()
                self._cond.notify_all()

    def close(self) -> None:
        """End custody (the engine is disposed): what it holds is given back,
        and its thread closes the administrative connection and ends."""
        with self._cond:
            self._closed = True
            held, self._held = list(self._held.values()), {}
            self._cond.notify_all()
        for item in held:
            for release in item.releases:
                release()

    # -- the confirming thread -----------------------------------------------------

    def _ensure_thread(self) -> None:
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(
                target=self._run, name="dataservice-custody", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        retry_s = _RETRY_FIRST_S
        while True:
            with self._cond:
                while not (self._closed or self._held or self._admin_wanted()):
                    if not self._cond.wait(self._ping_every_s) and self._admin is not None:
                        break  # idle this long: ping it
                if self._closed:
                    break
                idle = not self._held
            try:
                if idle and self._admin is not None:
                    self._admin.ping()
                    continue
                admin = self._admin_connection()
                retry_s = _RETRY_FIRST_S
                self._confirm(admin)
            except Exception as exc:  # any failure: a new administrative connection
                log.warning("custody: administrative connection failed (%s)", type(exc).__name__)
                self._lose_admin()
                self._sleep(retry_s)
                retry_s = min(retry_s * 2, _RETRY_LAST_S)
        self._drop_admin()

    def _admin_wanted(self) -> bool:
        return self._want_admin and self._admin is None

    def _admin_connection(self) -> Any:
        if self._admin is None:
            self._before_connect()
            admin = self._connect()
            try:
                self._admin_id, self._admin_origin = identify(admin)
            except BaseException:
                admin.close()
                raise
            self._admin = admin
            with self._cond:
                self._admin_connects += 1
        return self._admin

    def _lose_admin(self) -> None:
        """The administrative connection failed: like any connection let go
        of, it counts until a new one confirms it gone (the server may still
        hold it, if only the path to it broke)."""
        lost_id, lost_origin = self._admin_id, self._admin_origin
        self._drop_admin()
        with self._cond:
            if lost_id is not None and not self._closed:
                self._take(lost_id, lost_origin)
            # Nothing waits on it: open it again when next asked.
            if not self._held:
                self._want_admin = False

    def _drop_admin(self) -> None:
        admin, self._admin = self._admin, None
        self._admin_id = None
        if admin is not None:
            # It is gone either way.
            with contextlib.suppress(Exception):
                admin.close()

    def _confirm(self, admin: Any) -> None:
        """Confirm what is in custody now, until none of it is left.

        The process list first: a statement ends by itself, by its end or its
        server-side timeout, and a closed connection as soon as the server
        reads the close. Only one still listed ``KILL_AFTER_S`` after the
        server was first seen answering for it is KILLed (again every
        ``KILL_AGAIN_S``): a KILL can take the server seconds (it waits for a
        busy mutex the victim sleeps on), and the KILLs are sent one by one."""
        look_s = _FIRST_LOOK_S
        while True:
            with self._cond:
                pending = list(self._held.values())
            if not pending:
                return
            now = time.monotonic()
            here = [h for h in pending if self._here(h)]
            gone = [h for h in pending if h not in here and self._gone_elsewhere(h, now)]
            listed = self._still_listed(admin, here)
            gone.extend(h for h in here if h.connection_id not in listed)
            self._release(gone)
            now = time.monotonic()
            for held in here:
                if held.connection_id not in listed:
                    continue
                if held.listed_since is None:
                    held.listed_since = now
                if self._kill_due(held, now) and not self._kill(admin, held):
                    self._release([held])
            if len(gone) < len(pending):
                self._sleep(look_s)
                look_s = min(look_s * 2, _LONGEST_LOOK_S)
            else:
                look_s = _FIRST_LOOK_S

    def _here(self, held: _Held) -> bool:
        """Whether the administrative connection sees the server, in the same
        life, that ``held`` was made to (an unknown origin: assume so)."""
        if held.origin is None or self._admin_origin is None:
            return True
        return held.origin.same_boot(self._admin_origin)

    def _gone_elsewhere(self, held: _Held, now: float) -> bool:
        """A connection custody cannot see: gone if its server restarted since
        (a restart ends every statement), else once its statement's server-side
        timeout has certainly passed (behind a proxy or a moved address)."""
        assert held.origin is not None
        assert self._admin_origin is not None
        if held.origin.server == self._admin_origin.server:
            return True
        return now - held.since >= self._outlast_s

    @staticmethod
    def _kill_due(held: _Held, now: float) -> bool:
        if held.kill_refused or held.listed_since is None:
            return False
        if held.killed_at is None:
            return now - held.listed_since >= KILL_AFTER_S
        return now - held.killed_at >= KILL_AGAIN_S

    def _kill(self, admin: Any, held: _Held) -> bool:
        """KILL the connection; False if the server no longer knows it."""
        cursor = admin.cursor()
        try:
            cursor.execute(f"KILL CONNECTION {int(held.connection_id)}")
        except Exception as exc:
            code = exc.args[0] if exc.args else None
            if code == _UNKNOWN_THREAD:
                return False
            if code != _NOT_OWNER:
                raise
            log.error(
                "custody: the server refused to KILL connection %d; waiting for it to end",
                held.connection_id,
            )
            held.kill_refused = True
            return True
        finally:
            cursor.close()
        held.killed_at = time.monotonic()
        with self._cond:
            self._killed += 1
        return True

    @staticmethod
    def _still_listed(admin: Any, held: list[_Held]) -> set[int]:
        if not held:
            return set()
        ids = ",".join(str(int(h.connection_id)) for h in held)
        cursor = admin.cursor()
        try:
            cursor.execute(f"SELECT ID FROM information_schema.PROCESSLIST WHERE ID IN ({ids})")
            return {int(row[0]) for row in cursor.fetchall()}
        finally:
            cursor.close()

    def _release(self, gone: list[_Held]) -> None:
        if not gone:
            return
        releases: list[Callable[[], None]] = []
        with self._cond:
            for held in gone:
                if self._held.pop(held.connection_id, None) is not None:
                    releases.extend(held.releases)
            self._cond.notify_all()
        for release in releases:
            release()
