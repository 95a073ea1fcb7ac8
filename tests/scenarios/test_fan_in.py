"""Many calls in flight from one process: however many, the process holds a
handful of Redis connections (the reply channel's reader, the publish pool),
every call gets its own answer, and a cancelled or timed-out await takes no
other call's. Real worker processes serve the reads."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable, Iterator

import pytest
import redis
from dataservice_tools.testkit.sockets import own_local_ports

from dataservice import AsyncClient, Client, DeadlineExceeded, Record, ResourceExhausted, WriteOp
from dataservice.config.model import Config
from dataservice.config.settings import Settings
from dataservice.ops.supervisor import Supervisor
from dataservice.redis.keys import reply_key
from tests.harness.support import bounded_admission, connections_of_this_process

pytestmark = pytest.mark.load

# What a client process may hold, whatever its concurrency.
MOST_CONNECTIONS = 4
THREADS = 1000
COROUTINES = 5000
BURSTS = 3
RECORDS = 200
FAN_IN_REDIS_URL = "redis://127.0.0.1:6379/13"


class Peak:
    """The most connections the process held, sampled while ``during`` runs."""

    def __init__(self, redis_client: redis.Redis) -> None:
        self._redis = redis_client
        # Its own connection is not the client's.
        redis_client.ping()
        self._before = own_local_ports()
        self.most = 0

    def count(self) -> int:
        return connections_of_this_process(self._redis, self._before)

    def during(self, run: Callable[[], None]) -> None:
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.02):
                self.most = max(self.most, self.count())

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            run()
        finally:
            stop.set()
            sampler.join(5)
        self.most = max(self.most, self.count())


@pytest.fixture(scope="module")
def fleet(
    settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Settings, Config, list[str]]]:
    """Worker processes whose interactive lane admits a burst of 5,000 at
    once (the shipped bounds refuse most of it: 2,000 messages, a 500 ms
    standing queue), and records whose payloads are their ids."""
    directory = tmp_path_factory.mktemp("fan-in")
    bounds = {"max_messages": 20_000, "max_bytes": 1 << 26}
    with bounded_admission(settings, FAN_IN_REDIS_URL, directory, interactive=bounds) as bounded:
        fan_in_settings, config, _ = bounded
        supervisor = Supervisor(fan_in_settings, config, directory / "logs")
        supervisor.start()
        try:
            supervisor.wait_ready()
            ids = [f"r{n}" for n in range(RECORDS)]
            with Client("tests", fan_in_settings, config) as client:
                writes = [WriteOp("fan-in", i, i.encode()) for i in ids]
                for handle in client.submit_many(writes, timeout=60):
                    handle.result()
            yield fan_in_settings, config, ids
        finally:
            supervisor.stop()


def _own(record: object, object_id: str) -> bool:
    """The answer is the record asked for (its payload names it)."""
    return isinstance(record, Record) and record.payload == object_id.encode()


def test_a_thousand_threads_share_one_sync_client_on_four_connections(
    fleet: tuple[Settings, Config, list[str]],
) -> None:
    settings, config, ids = fleet
    counter = redis.Redis.from_url(settings.result_backend_url)
    peak = Peak(counter)
    answered: list[bool] = []
    failures: list[BaseException] = []

    def burst(client: Client) -> None:
        start = threading.Barrier(THREADS)

        def call(n: int) -> None:
            object_id = ids[n % len(ids)]
            start.wait(30)
            try:
                answered.append(_own(client.read("fan-in", object_id, timeout=30), object_id))
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=call, args=(n,)) for n in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)

    with Client("tests", settings, config) as client:
        for _ in range(BURSTS):
            peak.during(lambda: burst(client))
    counter.close()
    assert not failures, failures[:3]
    assert len(answered) == THREADS * BURSTS
    assert all(answered)
    print(f"sync: {THREADS} threads, peak {peak.most} connections")
    assert 0 < peak.most <= MOST_CONNECTIONS


def test_five_thousand_coroutines_share_one_async_client_on_four_connections(
    fleet: tuple[Settings, Config, list[str]],
) -> None:
    settings, config, ids = fleet
    counter = redis.Redis.from_url(settings.result_backend_url)
    peak = Peak(counter)
    outcomes: list[object] = []

    async def read(client: AsyncClient, object_id: str) -> bool:
        return _own(await client.read("fan-in", object_id, timeout=30), object_id)

    async def bursts() -> None:
        async with AsyncClient("tests", settings, config) as client:
            for _ in range(BURSTS):
                calls = [read(client, ids[n % len(ids)]) for n in range(COROUTINES)]
                outcomes.extend(await asyncio.gather(*calls, return_exceptions=True))
                peak.most = max(peak.most, peak.count())

    peak.during(lambda: asyncio.run(bursts()))
    counter.close()
    failures = [o for o in outcomes if not isinstance(o, bool)]
    assert not failures, failures[:3]
    assert len(outcomes) == COROUTINES * BURSTS
    assert all(outcomes)
    print(f"async: {COROUTINES} coroutines, peak {peak.most} connections")
    assert 0 < peak.most <= MOST_CONNECTIONS


def test_cancelled_and_timed_out_awaits_take_no_other_calls_answer(
    fleet: tuple[Settings, Config, list[str]],
) -> None:
    """10,000 reads from 200 coroutines, a third of them cancelled or timed
    out at random moments: every read that completes gets its own record,
    the client works as before afterwards, and nothing stays on its channel."""
    settings, config, ids = fleet
    rng = random.Random(7)
    completed: list[bool] = []
    given_up = 0

    async def one(client: AsyncClient, object_id: str) -> None:
        nonlocal given_up
        call = client.read("fan-in", object_id, timeout=30)
        fate = rng.random()
        try:
            if fate < 0.15:
                # Cancelled: at once, or while its request is queued or answered.
                task = asyncio.ensure_future(call)
                await asyncio.sleep(rng.uniform(0, 0.01))
                task.cancel()
                record = await task
            elif fate < 0.3:
                record = await asyncio.wait_for(call, rng.uniform(0.0005, 0.01))
            elif fate < 0.35:
                # Its own deadline too short to be served.
                call.close()
                record = await client.read("fan-in", object_id, timeout=0.002)
            else:
                record = await call
        except (asyncio.CancelledError, TimeoutError, DeadlineExceeded, ResourceExhausted):
            given_up += 1
            return
        completed.append(_own(record, object_id))

    async def caller(client: AsyncClient, n: int) -> None:
        for k in range(50):
            await one(client, ids[(n * 50 + k) % len(ids)])

    async def main() -> tuple[list[bool], int]:
        async with AsyncClient("tests", settings, config) as client:
            await asyncio.gather(*(caller(client, n) for n in range(200)))
            # Afterwards, every read is answered as before.
            after = await asyncio.gather(*(client.read("fan-in", i, timeout=30) for i in ids))
            channel = reply_key("tests", client._transport.replies.channel)
            grace_s = config.results.grace_ms / 1000
            async with asyncio.timeout(grace_s + 5):
                while results.llen(channel):
                    await asyncio.sleep(0.05)
            replies = client._transport.replies
            print(f"dropped {replies.dropped}, given up {given_up}, waiting {replies.waiting}")
            # Answers to calls given up came, and went to nobody else.
            assert replies.dropped > 0
            assert replies.waiting == 0
            return [_own(r, i) for r, i in zip(after, ids, strict=True)], results.llen(channel)

    results = redis.Redis.from_url(settings.result_backend_url)
    after, left_on_channel = asyncio.run(main())
    results.close()
    assert given_up > 2000, given_up
    assert len(completed) + given_up == 10_000
    assert all(completed)
    assert all(after)
    assert left_on_channel == 0
