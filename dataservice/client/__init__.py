"""The caller's side: :class:`Client` and its :class:`Handle`.

- :mod:`.client`: the API and the retry loop.
- :mod:`.handle`: a submitted request and the wait for its answer.
- :mod:`.inbox`: one reply channel read by one thread, its answers handed to
  the calls that wait for them.
- :mod:`.pacer`: a caller's rate, kept in its own process.
- :mod:`.transport`: publish to a lane (through admission); answers come back
  through :class:`~dataservice.results.ResultStore`.
"""

from dataservice.client.client import Client
from dataservice.client.handle import Handle

__all__ = ["Client", "Handle"]
