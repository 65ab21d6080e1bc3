"""Content fingerprints of followed files: is what was read still the file's prefix?

A followed file keeps one stream only while the bytes already read (and published) are
still the start of the file. fio re-runs rewrite hist logs in place, operators copy files
over others, inode numbers are reused: neither the inode nor a fixed-size head and tail
can tell. :class:`Fingerprint` digests every byte as it is read:

* SHA-1 of the whole prefix, saved in the positions file and compared in full when a file
  is opened again (after a restart, or after it was closed to respect the descriptor
  cap): exact;
* CRC-32 of every 64 KiB block, for cheap checks of a file held open: its first and last
  blocks and the block in progress on every change, all blocks when the prefix is small
  or the file had been quiet (a rewrite, not an append), and otherwise a rotating window
  of blocks, so a long growing stream costs a bounded amount per change.
"""

from __future__ import annotations

import hashlib
import os
import zlib
from array import array

BLOCK = 64 * 1024
READ = 1 << 20
HEAD = 4096  # bytes of the head key (copies of a file are found by it, then verified)


class Fingerprint:
    """Digests of the first :attr:`length` bytes of a file, fed in order by :meth:`update`."""

    def __init__(self) -> None:
        self.length = 0
        self._sha = hashlib.sha1(usedforsecurity=False)
        self._crcs = array("I")  # one per complete block
        self._crc = 0  # of the block in progress
        self._cursor = 1  # next block of the rotating check (0 and the last are always checked)
        self._head = 0  # CRC-32 of the first min(length, HEAD) bytes

    @property
    def head(self) -> str:
        """``<n>:<crc>`` of the first ``n = min(length, 4096)`` bytes: a key to find copies."""
        return f"{min(self.length, HEAD)}:{self._head:08x}"

    def update(self, data: bytes) -> None:
        """Append ``data`` (the next bytes read from the file)."""
        if self.length < HEAD:
            self._head = zlib.crc32(data[: HEAD - self.length], self._head)
        self._sha.update(data)
        view = memoryview(data)
        pos = 0
        while pos < len(view):
            piece = view[pos : pos + BLOCK - self.length % BLOCK]
            self._crc = zlib.crc32(piece, self._crc)
            self.length += len(piece)
            pos += len(piece)
            if self.length % BLOCK == 0:
                self._crcs.append(self._crc)
                self._crc = 0

    def hexdigest(self) -> str:
        """SHA-1 (hex) of the bytes so far (the object stays usable)."""
        return self._sha.hexdigest()

    def holds(self, fd: int, *, full: bool, budget: int = READ) -> bool:
        """Whether the file behind ``fd`` still starts with the bytes digested.

        Args:
            fd: an open descriptor of the file.
            full: compare every block; otherwise the first, the last complete, the one in
                progress and ``budget`` bytes of others, in rotation.
            budget: bytes of the rotating window.

        Raises:
            OSError: reading failed.
        """
        n = len(self._crcs)
        if full:
            picks = list(range(n))
        else:
            picks = sorted({0, n - 1} | set(self._rotation(n, budget))) if n else []
        for i in picks:
            block = os.pread(fd, BLOCK, i * BLOCK)
            if len(block) != BLOCK or zlib.crc32(block) != self._crcs[i]:
                return False
        start = n * BLOCK
        if start < self.length:
            tail = os.pread(fd, self.length - start, start)
            if len(tail) != self.length - start or zlib.crc32(tail) != self._crc:
                return False
        return True

    def _rotation(self, n: int, budget: int) -> list[int]:
        k = min(n, max(1, budget // BLOCK))
        first = self._cursor % n
        self._cursor = first + k
        return [(first + j) % n for j in range(k)]

    @classmethod
    def of_file(cls, fd: int, length: int) -> Fingerprint | None:
        """The fingerprint of the file's first ``length`` bytes (None if it is shorter).

        Raises:
            OSError: reading failed.
        """
        fp = cls()
        while fp.length < length:
            data = os.pread(fd, min(READ, length - fp.length), fp.length)
            if not data:
                return None
            fp.update(data)
        return fp
