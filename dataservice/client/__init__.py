"""The caller's side: :class:`Client` and its :class:`Handle`.

- :mod:`.client`: the API and the retry loop.
- :mod:`.handle`: a submitted request and the wait for its answer.
- :mod:`.inbox`: the client's one reply channel, read by one thread over one
  connection, its answers handed to the calls that wait for them.
- :mod:`.pacer`: a caller's rate, kept in its own process.
- :mod:`.transport`: publish to a lane (through admission) on one broker
  connection, each request's answer expected on the inbox first.
"""

from dataservice.client.client import Client
from dataservice.client.handle import Handle

__all__ = ["Client", "Handle"]
