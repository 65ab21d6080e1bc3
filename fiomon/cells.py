"""Which cell a host belongs to: rendezvous (highest-random-weight) hashing.

A cell is one broker + one aggregator serving a share of the client hosts
(``deploy/README.md``, "Cells: past one aggregator"). An agent either names its cell or
derives it from its host name with :func:`assign_cell`: every cell gets a score
``blake2b(cell + "|" + host)`` and the host goes to the highest. The hash is fixed (not
Python's ``hash()``, which is salted per process), so the same host lands on the same cell
on every machine and Python version; adding an n-th cell moves only the hosts whose new
top score is the new cell, about 1/n of them, and removing a cell moves only its own hosts.

Pure logic, no I/O: the configuration loader (:mod:`fiomon.config`) calls it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def cell_score(cell: str, host: str) -> int:
    """The rendezvous score of ``host`` on ``cell``: 64 bits of blake2b of ``cell|host``.

    The bytes hashed are the UTF-8 text ``f"{cell}|{host}"``; the score is the digest (8
    bytes) read big-endian. Names cannot contain ``|`` (both are topic-level names), so
    no two (cell, host) pairs hash the same text.
    """
    digest = hashlib.blake2b(f"{cell}|{host}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def assign_cell(host: str, cells: Iterable[str]) -> str:
    """The cell of ``host`` among ``cells`` (names): the one with the highest score.

    Ties (64-bit, practically never) go to the smaller name, so the answer never depends
    on the list's order.

    Raises:
        ValueError: no cells.
    """
    names = list(cells)
    if not names:
        msg = "assign_cell: no cells to choose from"
        raise ValueError(msg)
    # max() keeps the first of equal keys: sorted, so a tie goes to the smaller name.
    return max(sorted(names), key=lambda c: cell_score(c, host))
