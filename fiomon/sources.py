"""Finished fio output files as chunked record sources for the offline report.

A :class:`FileSource` reads one file in chunks of a few MB and feeds the matching parser
(hist log or json+ stream, recognised by content). Its :attr:`FileSource.progress_ms`
says how far in time its records have reached, so the report can read files in step and
close quanta behind the slowest one, keeping memory bounded for runs of any length.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fiomon.bins import BinLayout, Unit
from fiomon.errors import OverlapError
from fiomon.fiojson import JsonSplitter, JsonStatusParser, looks_like_json
from fiomon.fiolog import HistLogOptions, HistLogParser, TimeKind
from fiomon.model import RecordBatch
from fiomon.overlap import covering
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


def host_labels(paths: list[Path]) -> list[str]:
    """Host label per file: its folder's name, or the file name when all share a folder."""
    parents = {p.resolve().parent for p in paths}
    if len(parents) > 1:
        return [p.resolve().parent.name for p in paths]
    return [p.name for p in paths]


SourceChoice = Literal["json", "hist", "both"]
SOURCE_HELP = {
    "json": "the json+ status streams (what the agent publishes live; they hold each "
    "job's last partial interval)",
    "hist": "the hist logs (a record every log_hist_msec; fio never writes a job's last "
    "partial interval to them)",
    "both": "count both anyway (every I/O of those jobs twice)",
}
_DECLARATION_BYTES = 64 << 20  # how far into a json+ file its first document may end


def declared_prefixes(path: Path) -> tuple[str, ...]:
    """The ``write_hist_log`` prefixes a json+ file's first document declares."""
    parser = JsonStatusParser(str(path), problems=ProblemLog())
    splitter = JsonSplitter(str(path), parser.problems, max_document_bytes=_DECLARATION_BYTES)
    with path.open("rb") as fh:
        read = 0
        while read < _DECLARATION_BYTES and (chunk := fh.read(CHUNK_BYTES)):
            read += len(chunk)
            for doc in splitter.feed(chunk):
                parser._note_hist_prefixes(doc)
                return tuple(sorted(parser.hist_prefixes))
    return ()


def choose_sources(
    paths: Sequence[Path], choice: SourceChoice | None
) -> tuple[list[Path], list[str]]:
    """The inputs to read, so that no I/O is counted twice (:mod:`fiomon.overlap`).

    Args:
        paths: the files given, in order.
        choice: which view to keep where a json+ stream and hist logs describe the same
            jobs; None when the user did not say.

    Returns:
        The paths to read (in the given order) and notes for the user.

    Raises:
        OverlapError: both views of the same jobs were given and ``choice`` is None.
    """
    json_files: list[tuple[str, tuple[str, ...]]] = []
    for p in paths:
        try:
            with p.open("rb") as fh:
                is_json = looks_like_json(fh.read(64))
        except OSError:
            continue  # reported as unreadable by the command itself
        if is_json:
            json_files.append((str(p), declared_prefixes(p)))
    covered: dict[str, list[Path]] = {}
    for p in paths:
        by = covering(str(p), json_files)
        if by is not None:
            covered.setdefault(by, []).append(p)
    if not covered or choice == "both":
        notes = []
        if covered:
            n = sum(len(v) for v in covered.values())
            notes.append(
                f"warning: --source both: {n} hist logs and the json+ streams that cover "
                "them are both counted (every I/O of those jobs twice)"
            )
        return list(paths), notes
    if choice is None:
        lines = []
        for by, hist in covered.items():
            names = ", ".join(str(h) for h in hist[:4]) + (" ..." if len(hist) > 4 else "")
            lines.append(f"  {by} and {len(hist)} hist log(s): {names}")
        options = "\n".join(f"  --source {k:<5} {v}" for k, v in SOURCE_HELP.items())
        msg = (
            "these inputs describe the same I/Os twice: a json+ status stream declares the "
            "hist logs of its jobs (write_hist_log):\n"
            + "\n".join(lines)
            + f"\nChoose one view:\n{options}"
        )
        raise OverlapError(msg)
    if choice == "json":
        drop = {str(h) for hist in covered.values() for h in hist}
        note = f"--source json: not reading {len(drop)} hist log(s) the json+ streams cover"
    else:
        drop = set(covered)
        note = f"--source hist: not reading {len(drop)} json+ stream(s): {', '.join(sorted(drop))}"
    return [p for p in paths if str(p) not in drop], [note]
