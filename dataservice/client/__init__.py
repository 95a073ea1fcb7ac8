"""The caller's side: :class:`Client` and its :class:`Handle`, and their
asyncio twins :class:`AsyncClient` and :class:`AsyncHandle`.

- :mod:`.calls`: the calls, written once for both clients as plans that do
  no I/O; :mod:`.base`: how they retry and ``read_many``'s rounds.
- :mod:`.client`, :mod:`.async_client`: the two clients, one blocking on each
  step of a plan, the other awaiting it.
- :mod:`.handle`: a submitted request and the wait for its answer.
- :mod:`.inbox`: the client's one reply channel, read by one thread over one
  connection, its answers handed to the calls that wait for them.
- :mod:`.pacer`: a caller's rate, kept in its own process.
- :mod:`.transport`: publish to a lane (through admission) on one broker
  connection, each request's answer expected on the inbox first;
  :mod:`.async_transport`: the same for asyncio, one publishing task per client.
"""

from dataservice.client.async_client import AsyncClient
from dataservice.client.client import Client
from dataservice.client.handle import AsyncHandle, Handle

__all__ = ["AsyncClient", "AsyncHandle", "Client", "Handle"]
