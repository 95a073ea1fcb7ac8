"""Cells: a deployment split into whole units, each on a Redis of its own.

A cell has its own broker (or RabbitMQ vhost), answers, admission's books,
limits, cache and coalescing locks, and its own worker replicas per lane; the
database and its budget are shared. ``queues.yml`` names the cells and any
caller pinned to one:

.. code-block:: yaml

    cells:
      names: [a, b, c]
      callers: {billing: b}   # pinned; every other caller by the rule below

Every other configured caller gets a cell by rendezvous hashing with
bounded loads. In the order of their names, each caller takes the cell with
the highest weight (a 64-bit BLAKE2b of the cell's name and the caller's)
among those that still have room: ``callers // cells`` each, and one more in
``callers % cells`` of them, pinned callers counted. Every process computes
the same cells from the same ``queues.yml`` with nothing shared. The cells'
caller counts differ by at most one (pins aside). Adding a cell takes it
about one caller in N and moves few others. A caller no policy names
(refused anyway) gets its highest-weight cell. To move a caller, pin it to
its new cell, deploy, and let its requests in the old cell drain (their
deadlines bound how long).

Where each cell's Redis is comes from the cells file
(:class:`~dataservice.config.settings.Settings`, ``DATASERVICE_CELLS_FILE``):
the URLs carry passwords, which ``queues.yml`` never holds. With no cells
named, the deployment is one cell on the environment's URLs.
"""

from __future__ import annotations

import functools
import hashlib
from collections import Counter
from collections.abc import Iterable
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

    def cell_of(self, caller: str, callers: Iterable[str] = ()) -> str | None:
        """The cell ``caller`` belongs to among ``callers`` (the configured
        ones: :meth:`Config.cell_of`); None when no cells are named."""
        if not self.names:
            return None
        pinned = self.callers.get(caller)
        if pinned is not None:
            return pinned
        table = self.assign(callers)
        return table.get(caller) or _ranked(self.names, caller)[0]

    def assign(self, callers: Iterable[str]) -> dict[str, str]:
        """Each of ``callers``' cell (empty when no cells are named)."""
        if not self.names:
            return {}
        pins = tuple(sorted(self.callers.items()))
        return dict(_assign(self.names, pins, tuple(sorted(set(callers)))))


def weight(cell: str, caller: str) -> int:
    """``caller``'s rendezvous weight for ``cell``: the same in every process."""
    digest = hashlib.blake2b(f"{cell}\x00{caller}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def _ranked(names: tuple[str, ...], caller: str) -> list[str]:
    return sorted(names, key=lambda cell: (weight(cell, caller), cell), reverse=True)


@functools.lru_cache(maxsize=32)
def _assign(
    names: tuple[str, ...], pins: tuple[tuple[str, str], ...], callers: tuple[str, ...]
) -> tuple[tuple[str, str], ...]:
    pinned = dict(pins)
    # n = q cells x ... + r: r cells may hold q + 1 callers, the rest q.
    q, r = divmod(len(callers), len(names))
    cells = {caller: pinned[caller] for caller in callers if caller in pinned}
    load = Counter(cells.values())

    def has_room(cell: str) -> bool:
        big = sum(1 for c in names if load[c] > q)
        return load[cell] < q or (load[cell] == q and big < r)

    for caller in callers:
        if caller in cells:
            continue
        ranked = _ranked(names, caller)
        # Pins may fill cells past the bound: then the best cell, as without one.
        cell = next((c for c in ranked if has_room(c)), ranked[0])
        cells[caller] = cell
        load[cell] += 1
    return tuple(cells.items())
