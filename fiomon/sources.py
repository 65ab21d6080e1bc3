"""Finished fio output files as chunked record sources for the offline report.

A :class:`FileSource` reads one file in chunks of a few MB and feeds the matching parser
(hist log or json+ stream, recognised by content). Its :attr:`FileSource.progress_ms`
says how far in time its records have reached, so the report can read files in step and
close quanta behind the slowest one, keeping memory bounded for runs of any length.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fiomon.bins import BinLayout, Unit
from fiomon.errors import ConfigError
from fiomon.fiojson import JsonStatusParser, looks_like_json
from fiomon.fiolog import HistLogOptions, HistLogParser, TimeKind
from fiomon.model import RecordBatch
from fiomon.problems import ProblemLog

CHUNK_BYTES = 2 << 20  # 2 MB: ~140 MB peak for 16 files read in step (4 MB: ~215 MB, no faster)


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """Parsing options shared by all files of a report.

    Args:
        interval_ms: ``log_hist_msec`` of the hist logs, or ``None`` to infer it.
        group_nr: force fio's GROUP_NR.
        unit: force the bin unit of hist logs.
        strict: make the first bad line fatal.
        chunk_bytes: read size.
    """

    interval_ms: int | None = None
    group_nr: int | None = None
    unit: Unit | None = None
    strict: bool = False
    chunk_bytes: int = CHUNK_BYTES


class FileSource:
    """One input file, read in chunks.

    Args:
        path: the file.
        host: host label of its records.
        options: see :class:`SourceOptions`.
    """

    def __init__(self, path: Path, host: str, options: SourceOptions) -> None:
        self.path = path
        self.name = str(path)
        self.problems = ProblemLog(strict=options.strict)
        self.options = options
        self._fh = path.open("rb")
        self.size = path.stat().st_size
        self.bytes_read = 0
        self.done = False
        self.max_end_ms: int | None = None
        head = self._fh.read(64)
        self._fh.seek(0)
        self.kind = "json" if looks_like_json(head) else "hist"
        self.parser: HistLogParser | JsonStatusParser
        if self.kind == "json":
            self.parser = JsonStatusParser(
                self.name,
                host=host,
                problems=self.problems,
                layout=BinLayout(options.group_nr) if options.group_nr else None,
            )
        else:
            self.parser = HistLogParser(
                self.name,
                host=host,
                options=HistLogOptions(options.interval_ms, options.group_nr, options.unit),
                problems=self.problems,
            )

    @property
    def layout(self) -> BinLayout | None:
        """Bin layout once known."""
        return self.parser.layout

    @property
    def time_kind(self) -> TimeKind | None:
        """``epoch`` or ``relative`` once known (json+ streams are always epoch)."""
        if isinstance(self.parser, JsonStatusParser):
            return "epoch" if self.parser.records else None
        return self.parser.time_kind

    @property
    def slack_ms(self) -> int:
        """How far a later record of this file may start before :attr:`max_end_ms`.

        Directions of one hist log interleave with stamps up to an interval apart, and a
        record starts one interval before its end.
        """
        if isinstance(self.parser, HistLogParser):
            return 2 * int(self.parser.interval_ms or 1000)
        return 0

    def next_batch(self) -> RecordBatch | None:
        """Parse the next chunk (the final call also finishes the parser)."""
        if self.done:
            return None
        chunk = self._fh.read(self.options.chunk_bytes)
        self.bytes_read += len(chunk)
        if chunk:
            batch = self.parser.feed(chunk)
        else:
            self.done = True
            self._fh.close()
            batch = self.parser.finish()
        if batch is not None and len(batch):
            end = int(batch.end_ms.max())
            self.max_end_ms = end if self.max_end_ms is None else max(self.max_end_ms, end)
        return batch

    def batches(self) -> Iterator[RecordBatch]:
        """The non-empty batches still to come, read on demand."""
        while not self.done:
            batch = self.next_batch()
            if batch is not None and len(batch):
                yield batch

    def close(self) -> None:
        """Release the file handle."""
        self.done = True
        self._fh.close()


HOST_FROM_HELP = (
    "how a file's host is named: auto (default: the nearest folder level whose names tell "
    "the files' folders apart, e.g. c1 and c2 in c1/results/ and c2/results/; with all files "
    "in one folder, the file rule), dir (the file's folder), dir:N (the folder N levels up), "
    "file (the file name without fio's suffix: client-07 from client-07.json and "
    "client-07_clat_hist.1.log, as `fiomon fio` names them), or regex:PATTERN (searched in "
    "the path as given; the group named host, else group 1, else the match)"
)
# fio's hist-log suffix (per job, per_job_logs=0, compressed) and the json+ stream's.
_FIO_SUFFIX = re.compile(r"(_(?:clat|lat|slat)_hist(?:\.\d+)?\.log(?:\.fz)?|\.json)$")


def check_host_from(how: str) -> str:
    """``how`` if it is a ``--host-from`` mode (see :data:`HOST_FROM_HELP`).

    Raises:
        ConfigError: an unknown mode, a level below 1, or a pattern that does not compile.
    """
    if how in ("auto", "dir", "file"):
        return how
    if how.startswith("dir:"):
        if not how[4:].isdigit() or int(how[4:]) < 1:
            msg = f"--host-from {how!r}: the level of dir:N is a whole number >= 1"
            raise ConfigError([msg])
        return how
    if how.startswith("regex:"):
        try:
            re.compile(how[6:])
        except re.error as exc:
            msg = f"--host-from {how!r}: not a regular expression ({exc})"
            raise ConfigError([msg]) from None
        return how
    msg = f"--host-from {how!r}: expected auto, dir, dir:N, file or regex:PATTERN"
    raise ConfigError([msg])


def _from_file(path: Path) -> str:
    name = _FIO_SUFFIX.sub("", path.name)
    return name if name and name != path.name else path.stem


def _from_regex(path: Path, pattern: str) -> str:
    m = re.search(pattern, str(path))
    if m is None:
        msg = f"--host-from regex:{pattern}: no host in {path}"
        raise ConfigError([msg])
    if "host" in m.re.groupindex:
        host = m.group("host")
    else:
        host = m.group(1) if m.re.groups else m.group(0)
    if not host:
        msg = f"--host-from regex:{pattern}: an empty host in {path}"
        raise ConfigError([msg])
    return str(host)


def _distinguishing_folders(paths: list[Path]) -> list[str]:
    """The nearest folder level whose names differ between the files' distinct folders."""
    folders = [p.resolve().parent for p in paths]
    distinct = sorted(set(folders))
    for level in range(max(len(f.parts) for f in distinct)):
        names = [(f, *f.parents)[level].name if level <= len(f.parents) else "" for f in distinct]
        if all(names) and len(set(names)) == len(names):
            by_folder = dict(zip(distinct, names, strict=True))
            return [by_folder[f] for f in folders]
    # No single level tells them apart (c1/x/r, c2/x/r, c1/y/r): their paths below the
    # common ancestor do.
    common = Path(os.path.commonpath(distinct))
    return [str(f.relative_to(common)) for f in folders]


def host_labels(paths: list[Path], how: str = "auto") -> list[str]:
    """Host label per file, by the ``--host-from`` mode ``how`` (see :data:`HOST_FROM_HELP`).

    Raises:
        ConfigError: a bad mode, a file the pattern of ``regex:`` does not match, or one
            without that many folders above it.
    """
    check_host_from(how)
    if how == "file" or (how == "auto" and len({p.resolve().parent for p in paths}) <= 1):
        return [_from_file(p) for p in paths]
    if how == "auto":
        return _distinguishing_folders(paths)
    if how.startswith("regex:"):
        return [_from_regex(p, how[6:]) for p in paths]
    level = int(how[4:]) if how.startswith("dir:") else 1
    out = []
    for p in paths:
        parents = p.resolve().parents
        if level > len(parents) or not parents[level - 1].name:
            msg = f"--host-from {how}: {p} has no folder {level} level(s) up"
            raise ConfigError([msg])
        out.append(parents[level - 1].name)
    return out
