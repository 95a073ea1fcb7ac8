"""The asyncio client against a real worker: the calls, the handles, and
what a cancelled wait leaves behind."""

from __future__ import annotations

import asyncio

import pytest

from dataservice import AsyncClient, NotFound, Record, WriteResult
from dataservice.config.model import Config
from dataservice.config.settings import Settings

pytestmark = pytest.mark.usefixtures("interactive_worker")


@pytest.mark.timeout(20)
def test_read_write_and_not_found_through_the_async_client(
    settings: Settings, config: Config, scope: str
) -> None:
    async def main() -> None:
        async with AsyncClient("tests", settings, config) as client:
            written = await client.write(scope, "a", b"payload-a", timeout=10)
            assert isinstance(written, WriteResult)
            record = await client.read(scope, "a", timeout=10)
            assert isinstance(record, Record)
            assert record.payload == b"payload-a"
            with pytest.raises(NotFound):
                await client.read(scope, "missing", timeout=10)
            many = await client.read_many(scope, ["a", "missing"], timeout=10)
            assert isinstance(many[0], Record)
            assert isinstance(many[1], NotFound)

    asyncio.run(main())
