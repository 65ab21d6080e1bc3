"""Recursive ``**`` globs over growing trees, at a bounded cost per scan.

Benchmark harnesses write each run into a folder of its own (``results/run1/``, pbench-fio's
``fio_*/1-read-4KiB/sample1/clients/HOST/``, CBT's ``results/00000000/id-*/``), so a
``watch`` pattern has to reach folders that do not exist yet when the agent starts.

Semantics are those of ``glob.glob(pattern, recursive=True)`` and :mod:`pathlib`:

* a path component that is exactly ``**`` matches zero or more folders (``/r/**/*.log``
  matches ``/r/a.log``, ``/r/x/a.log`` and ``/r/x/y/z/a.log``); ``**`` inside a longer
  component (``/r/**.log``) is a plain ``*``;
* other components are :mod:`fnmatch` patterns of one name; names starting with ``.`` match
  only components that start with ``.``, so ``**`` does not enter hidden folders;
* symbolic links to folders are followed while they stay inside the pattern's fixed root
  (``results/latest -> run5``); ``**`` does not follow a link out of it (``results/other ->
  /srv/h2/results`` would publish another host's files as this host's: counted twice); a
  folder reached twice in one scan (a link loop, or a link to a folder also reached
  directly) is walked once, under its real name first (links are walked after folders).

Cost per scan: one ``stat`` per folder the pattern can reach below its fixed root (the
leading components without wildcards) and one ``scandir`` per folder whose modification
time changed since it was last listed. A folder is listed again also while its last change
is less than ``RACY_NS`` older than its listing (file system timestamps are coarse: two
changes in one tick leave one mtime) and when its listing is older than ``RELIST_NS``
(network file systems whose clocks differ). At most ``max_folders`` folders are visited per
scan; the rest of a larger tree is not, and :attr:`TreeGlob.truncated` says so. Measured
(ext4, warm cache, a busy 2-core VM): 20 202 folders in 100 ms per scan once listed, 240 ms
for the first listing (``glob.glob(..., recursive=True)`` takes 190 ms every time), i.e.
about 5 µs per folder. The agent scans every ``poll_interval`` but spaces a tree's scans to
at least ten times their duration, so a big tree costs at most a tenth of one core and new
files in it are seen within ``max(poll_interval, 10 x scan time)``.
"""

from __future__ import annotations

import fnmatch
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass

RACY_NS = 2_000_000_000
RELIST_NS = 60_000_000_000
MAX_FOLDERS = 100_000


def is_recursive(pattern: str) -> bool:
    """Whether ``pattern`` has a ``**`` component (the only case :class:`TreeGlob` is for)."""
    return "**" in pattern.split(os.sep)


def _magic(component: str) -> bool:
    return any(c in component for c in "*?[")


@dataclass(slots=True)
class _Listing:
    mtime_ns: int
    listed_ns: int
    folders: tuple[str, ...]
    others: tuple[str, ...]  # every entry that is not a folder (files, sockets, dead links)
    links: frozenset[str] = frozenset()  # the folders that are symbolic links
    seen: bool = True  # visited in the current scan


class TreeGlob:
    """One recursive pattern, expanded again by :meth:`refresh`.

    Args:
        pattern: a glob pattern with at least one ``**`` component.
        max_folders: folders visited at most per scan.
        wall_ns: wall-clock epoch nanoseconds (injected for tests).
    """

    def __init__(
        self,
        pattern: str,
        *,
        max_folders: int = MAX_FOLDERS,
        wall_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        if not is_recursive(pattern):
            msg = f"not a recursive pattern (no ** component): {pattern!r}"
            raise ValueError(msg)
        self.pattern = pattern
        comps = pattern.split(os.sep)
        fixed = 0
        while fixed < len(comps) - 1 and not _magic(comps[fixed]):
            fixed += 1
        self.root = os.sep.join(comps[:fixed]) or (os.sep if pattern.startswith(os.sep) else ".")
        self._comps = [c for c in comps[fixed:] if c]  # "a//b" is "a/b"
        self._relative = fixed == 0 and not pattern.startswith(os.sep)
        self.max_folders = max_folders
        self._wall_ns = wall_ns
        self._cache: dict[str, _Listing] = {}
        self.paths: list[str] = []
        self.truncated = False
        self.folders = 0  # visited in the last scan
        # this scan's folders: listing, device, inode (None: not a folder)
        self._scan: dict[str, tuple[_Listing, int, int] | None] = {}
        self.listed = 0  # of which listed again (scandir)
        self.escaped: set[str] = set()  # links out of the root ** did not follow (last scan)
        self._real_root = ""

    def refresh(self) -> bool:
        """Scan the tree again; whether any listing or the set of matches changed."""
        for entry in self._cache.values():
            entry.seen = False
        self.folders = self.listed = 0
        self.truncated = False
        found: set[str] = set()
        visited: set[tuple[int, int, int]] = set()
        self._scan = {}
        self.escaped = set()
        self._real_root = os.path.realpath(self.root)
        self._walk(self.root, 0, found, visited)
        self._scan = {}
        for key in [k for k, v in self._cache.items() if not v.seen]:
            del self._cache[key]
        paths = sorted(found)
        changed = self.listed > 0 or paths != self.paths
        self.paths = paths
        return changed

    def _walk(
        self, folder: str, i: int, found: set[str], visited: set[tuple[int, int, int]]
    ) -> None:
        listing = self._list(folder, i, visited)
        if listing is None:
            return
        comp = self._comps[i]
        last = i == len(self._comps) - 1
        if comp == "**":
            if last:  # everything below (glob returns folders too; the follower wants files)
                for name in _visible(listing.others, comp):
                    found.add(self._join(folder, name))
            else:
                self._walk(folder, i + 1, found, visited)
            # real folders first: a folder also reached through a link keeps its real name
            below = sorted(_visible(listing.folders, comp), key=lambda n: n in listing.links)
            for name in below:
                sub = self._join(folder, name)
                if name in listing.links and not self._inside(sub):
                    self.escaped.add(sub)
                    continue
                if last:
                    found.add(sub)
                self._walk(sub, i, found, visited)
            return
        names = listing.folders + listing.others if last else listing.folders
        if _magic(comp):
            names = tuple(n for n in _visible(names, comp) if fnmatch.fnmatchcase(n, comp))
        else:
            names = (comp,) if comp in names else ()
        for name in names:
            path = self._join(folder, name)
            if last:
                found.add(path)
            else:
                self._walk(path, i + 1, found, visited)

    def _inside(self, path: str) -> bool:
        """Whether ``path`` resolves inside the pattern's fixed root."""
        real = os.path.realpath(path)
        root = self._real_root
        return real == root or real.startswith(root.rstrip(os.sep) + os.sep)

    def _join(self, folder: str, name: str) -> str:
        if self._relative and folder == ".":
            return name
        return os.path.join(folder, name)

    def _list(self, folder: str, i: int, visited: set[tuple[int, int, int]]) -> _Listing | None:
        """The entries of ``folder`` once per walk at ``i``; None if not a folder (or walked)."""
        if folder not in self._scan:
            self._scan[folder] = self._stat_and_list(folder)
        got = self._scan[folder]
        if got is None:
            return None
        listing, dev, ino = got
        if (dev, ino, i) in visited:
            return None  # a link loop, or a second way into a folder already walked
        visited.add((dev, ino, i))
        return listing

    def _stat_and_list(self, folder: str) -> tuple[_Listing, int, int] | None:
        """The entries of ``folder`` (cached while its mtime holds); None if not a folder."""
        if self.folders >= self.max_folders:
            self.truncated = True
            return None
        self.folders += 1
        try:
            st = os.stat(folder)
        except OSError:
            return None
        if not stat.S_ISDIR(st.st_mode):
            return None
        now = self._wall_ns()
        cached = self._cache.get(folder)
        if (
            cached is not None
            and cached.mtime_ns == st.st_mtime_ns
            and cached.listed_ns - st.st_mtime_ns >= RACY_NS
            and now - cached.listed_ns < RELIST_NS
        ):
            cached.seen = True
            return cached, st.st_dev, st.st_ino
        folders: list[str] = []
        others: list[str] = []
        links: set[str] = set()
        try:
            with os.scandir(folder) as it:
                for entry in it:
                    try:
                        is_dir = entry.is_dir()  # follows links, as glob does
                    except OSError:
                        is_dir = False
                    (folders if is_dir else others).append(entry.name)
                    if is_dir and entry.is_symlink():
                        links.add(entry.name)
        except OSError:
            self._cache.pop(folder, None)
            return None
        self.listed += 1
        listing = _Listing(
            st.st_mtime_ns, now, tuple(sorted(folders)), tuple(sorted(others)), frozenset(links)
        )
        self._cache[folder] = listing
        return listing, st.st_dev, st.st_ino


def _visible(names: tuple[str, ...], comp: str) -> tuple[str, ...]:
    """Names a component may match: hidden ones only for a component starting with ``.``."""
    if comp.startswith("."):
        return names
    return tuple(n for n in names if not n.startswith("."))
