"""Cells: a deployment split into whole units, each on a Redis of its own.

A cell has its own broker (or RabbitMQ vhost), answers, admission's books,
limits, cache and coalescing locks, and its own worker replicas per lane; the
database and its budget are shared. ``queues.yml`` names the cells and any
caller pinned to one:

.. code-block:: yaml

    cells:
      names: [a, b, c]
      callers: {billing: b}   # pinned; every other caller by the rule below

Every other caller belongs to the cell with the highest rendezvous weight
(a 64-bit BLAKE2b of the cell's name and the caller's) over the cells named:
every process computes the same cell with nothing shared, adding a cell moves
only the callers it wins (about one in N), and removing one moves only its
own. To move a caller, pin it to its new cell, deploy, and let its requests
in the old cell drain (their deadlines bound how long).

Where each cell's Redis is comes from the cells file
(:class:`~dataservice.config.settings.Settings`, ``DATASERVICE_CELLS_FILE``):
the URLs carry passwords, which ``queues.yml`` never holds. With no cells
named, the deployment is one cell on the environment's URLs.
"""

from __future__ import annotations

import hashlib
from typing import Annotated

from pydantic import Field, model_validator

from dataservice import identifiers
from dataservice.config.frozen import FrozenModel

CellName = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,31}$")]
CallerName = Annotated[str, Field(pattern=identifiers.anchored(identifiers.CALLER))]


class CellsConfig(FrozenModel):
    names: Annotated[tuple[CellName, ...], Field(strict=False)] = ()
    callers: dict[CallerName, CellName] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known_and_unique(self) -> CellsConfig:
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"cells.names repeats a name: {list(self.names)}")
        unknown = sorted({cell for cell in self.callers.values() if cell not in self.names})
        if unknown:
            raise ValueError(f"cells.callers names cells not in cells.names: {unknown}")
        return self

    @property
    def count(self) -> int:
        """How many cells share the database (one when none is named)."""
        return max(len(self.names), 1)

    def cell_of(self, caller: str) -> str | None:
        """The cell ``caller`` belongs to (None: no cells are named)."""
        if not self.names:
            return None
        pinned = self.callers.get(caller)
        if pinned is not None:
            return pinned
        return max(self.names, key=lambda cell: weight(cell, caller))


def weight(cell: str, caller: str) -> int:
    """``caller``'s rendezvous weight for ``cell``: the same in every process."""
    digest = hashlib.blake2b(f"{cell}\x00{caller}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")
