"""Compare two lists of collected test ids across a move of test modules.

Each list is what ``pytest --collect-only -q -m ""`` prints, one id a line
(``tests/client/test_handles.py::test_wait[sync]``). An id is matched by its
module's basename and what follows it (class, function, parameters), so a module
that moved to another folder keeps its tests; what is left over on either side is
a test lost or a test new. Run from the repository's root::

    python -m tests.harness.ids before.txt after.txt

It prints the ids matched, lost and new, and exits 1 if any id was lost.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path


def by_name(test_id: str) -> str:
    """``tests/a/test_x.py::test_y[p]`` -> ``test_x.py::test_y[p]``."""
    path, _, rest = test_id.partition("::")
    return f"{Path(path).name}::{rest}"


def ids(listing: Path) -> list[str]:
    return [line.strip() for line in listing.read_text().splitlines() if "::" in line]


def compare(before: list[str], after: list[str]) -> tuple[int, list[str], list[str]]:
    """(how many matched, the ids lost, the ids new), each named as listed."""
    old = Counter(by_name(i) for i in before)
    new = Counter(by_name(i) for i in after)
    lost = [i for i in before if (old - new)[by_name(i)]]
    added = [i for i in after if (new - old)[by_name(i)]]
    return sum((old & new).values()), lost, added


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    before, after = ids(Path(argv[0])), ids(Path(argv[1]))
    moved = {(by_name(i), i) for i in after} - {(by_name(i), i) for i in before}
    matched, lost, added = compare(before, after)
    print(f"before {len(before)}, after {len(after)}, matched {matched}, moved {len(moved)}")
    for test_id in lost:
        print(f"lost: {test_id}")
    for test_id in added:
        print(f"new: {test_id}")
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
