"""The agent's durable read state: one entry per followed stream, written atomically.

``positions.json`` in the state directory says, per stream (one content lineage of one
followed file, see :mod:`fiomon.agent.follow`): where the file is (path, device, inode), which
bytes were read (their length and SHA-1), how many records those bytes gave, and up to
which sequence number the broker acknowledged them. A restart re-reads a file whose
first ``length`` bytes still hash to ``sha1``, skipping acknowledged records, so it
neither resends nor skips; any other file is a new stream.

It is written atomically (temporary file, fsync, rename): a crash or a full disk leaves
the old file or the new one, never a torn one, and the positions never claim more than
what was durable.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from fiomon.runtime import write_atomic

POSITIONS_VERSION = 2
LEGACY_PREFIX = "v1:"  # sha1 field of an entry migrated from version 1 (head digest only)


@dataclass(slots=True)
class Resume:
    """What is known of one stream while its file is not open (saved, or closed for now).

    Args:
        stream: the stream id (``<path>@<content digest>``, see :mod:`fiomon.agent.follow`).
        path: where the file was last seen.
        dev: its device.
        ino: its inode.
        length: bytes read from its start.
        sha1: hex SHA-1 of those bytes.
        records: records those bytes gave (sequence numbers ``0 .. records - 1``).
        acked_seq: records below this were acknowledged by the broker.
        time_offset_ms: wall-clock offset of a relative-time hist log, or None.
        covered_by: the stream that publishes this file's I/Os instead (a json+ stream
            for a hist log of its jobs, or the original of a copy), or None.
        copy: ``covered_by`` is the original of a copy (compared again as either grows).
        declares: for a json+ stream: the hist-log names its jobs write.
        span_ms: for a json+ stream: the time its I/Os cover, ``[first, last]`` epoch ms.
        slack_ms: for a json+ stream: how far a covered hist log may reach outside it.
        head: the head key of the bytes read (:attr:`Fingerprint.head`), to find copies.
        size: the file's size when last read (a change while closed reopens it).
        mtime_ns: its modification time then.
        orphan_until_ms: renamed out of the watch patterns: followed (by ``path``) until
            this wall-clock time.
        gone: the file was deleted (kept to recognise a copy of it, e.g. ``mv`` across
            file systems).
    """

    stream: str
    path: str
    dev: int
    ino: int
    length: int
    sha1: str
    records: int = 0
    acked_seq: int = 0
    time_offset_ms: int | None = None
    covered_by: str | None = None
    copy: bool = False
    declares: tuple[str, ...] = ()
    span_ms: tuple[int, int] | None = None
    slack_ms: int = 0
    head: str = ""
    size: int = 0
    mtime_ns: int = 0
    orphan_until_ms: int | None = None
    gone: bool = False

    def to_json(self) -> dict[str, object]:
        """A JSON-able dict (the positions file's entry)."""
        return {
            "path": self.path,
            "dev": self.dev,
            "ino": self.ino,
            "length": self.length,
            "sha1": self.sha1,
            "records": self.records,
            "acked_seq": self.acked_seq,
            "time_offset_ms": self.time_offset_ms,
            "covered_by": self.covered_by,
            "copy": self.copy,
            "declares": list(self.declares),
            "span_ms": list(self.span_ms) if self.span_ms is not None else None,
            "slack_ms": self.slack_ms,
            "head": self.head,
            "size": self.size,
            "mtime_ns": self.mtime_ns,
            "orphan_until_ms": self.orphan_until_ms,
            "gone": self.gone,
        }

    @classmethod
    def from_json(cls, stream: str, data: dict[str, object]) -> Resume:
        """Inverse of :meth:`to_json`.

        Raises:
            ValueError: a field is missing or has the wrong type.
        """

        def num(key: str) -> int:
            v = data.get(key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                msg = f"{key} is not a non-negative integer"
                raise ValueError(msg)
            return v

        def text(key: str, *, optional: bool = False) -> str | None:
            v = data.get(key)
            if v is None and optional:
                return None
            if not isinstance(v, str):
                msg = f"{key} is not a string"
                raise ValueError(msg)
            return v

        def opt_int(key: str) -> int | None:
            v = data.get(key)
            if v is None:
                return None
            if not isinstance(v, int) or isinstance(v, bool):
                msg = f"{key} is not an integer"
                raise ValueError(msg)
            return v

        declares = data.get("declares", [])
        if not isinstance(declares, list) or not all(isinstance(p, str) for p in declares):
            msg = "declares is not a list of strings"
            raise ValueError(msg)
        span = data.get("span_ms")
        if span is not None and not (
            isinstance(span, list) and len(span) == 2 and all(isinstance(v, int) for v in span)
        ):
            msg = "span_ms is not a pair of integers"
            raise ValueError(msg)
        return cls(
            stream=stream,
            path=str(text("path")),
            dev=num("dev"),
            ino=num("ino"),
            length=num("length"),
            sha1=str(text("sha1")),
            records=num("records"),
            acked_seq=num("acked_seq"),
            time_offset_ms=opt_int("time_offset_ms"),
            covered_by=text("covered_by", optional=True),
            copy=data.get("copy") is True,
            declares=tuple(declares),
            span_ms=(span[0], span[1]) if span is not None else None,
            slack_ms=opt_int("slack_ms") or 0,
            head=str(text("head", optional=True) or ""),
            size=num("size"),
            mtime_ns=num("mtime_ns"),
            orphan_until_ms=opt_int("orphan_until_ms"),
            gone=data.get("gone") is True,
        )


@dataclass(slots=True)
class FollowState:
    """Everything the positions file holds.

    Args:
        streams: stream id -> :class:`Resume`.
        next_generation: the smallest generation number not yet used (the ids of streams
            whose first record repeats another lineage's, see :mod:`fiomon.agent.follow`).
    """

    streams: dict[str, Resume] = field(default_factory=dict)
    next_generation: int = 0

    def to_json(self) -> dict[str, object]:
        """The positions file's document."""
        return {
            "version": POSITIONS_VERSION,
            "next_generation": self.next_generation,
            "streams": {s: r.to_json() for s, r in sorted(self.streams.items())},
        }


def save_positions(path: Path, state: FollowState) -> int:
    """Write the positions file atomically; returns its size in bytes.

    Raises:
        OSError: it could not be written (the previous file stays as it was).
    """
    data = json.dumps(state.to_json(), separators=(",", ":")).encode()
    write_atomic(path, data)
    return len(data)


def load_positions(path: Path) -> tuple[FollowState, list[str]]:
    """Positions saved by :func:`save_positions`, and problems met (a missing file is none).

    A damaged file (empty, not JSON, an unknown format, unreadable) is reported, moved
    aside to ``positions.json.damaged`` (kept for a post-mortem, replacing an older one)
    and ignored; a damaged entry is reported and ignored. Their files are then read from
    their start: a stream's id comes from its content (:mod:`fiomon.agent.follow`), so the
    same records go out under the same ``(agent, stream, seq)`` and the aggregator drops
    them as duplicates. Version 1 files (one entry per path) are read.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return FollowState(), []
    except OSError as exc:
        return _damaged(path, f"cannot read ({exc.strerror or exc})")
    if not raw.strip():
        return _damaged(path, f"empty ({len(raw)} bytes)")
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        return _damaged(path, f"not valid JSON ({exc})")
    if not isinstance(doc, dict):
        return _damaged(path, "unknown format (not a JSON object)")
    if doc.get("version") == 1:
        return _load_v1(path, doc)
    if doc.get("version") != POSITIONS_VERSION:
        return _damaged(path, f"unknown format (version {doc.get('version')!r})")
    state = FollowState()
    gen = doc.get("next_generation")
    state.next_generation = gen if isinstance(gen, int) and gen >= 0 else 0
    problems: list[str] = []
    streams = doc.get("streams")
    for stream, entry in (streams if isinstance(streams, dict) else {}).items():
        try:
            if not isinstance(entry, dict):
                msg = "entry is not an object"
                raise ValueError(msg)
            state.streams[str(stream)] = Resume.from_json(str(stream), entry)
        except ValueError as exc:
            problems.append(f"{path}: stream {stream!r}: {exc}; its file starts afresh")
    return state, problems


def _damaged(path: Path, why: str) -> tuple[FollowState, list[str]]:
    """Move a damaged positions file aside (if it can be) and say so."""
    aside = path.with_name(path.name + ".damaged")
    try:
        os.replace(path, aside)
        where = f"moved aside to {aside}"
    except OSError as exc:
        where = f"could not be moved aside ({exc.strerror or exc})"
    return FollowState(), [
        f"{path}: positions file damaged: {why}; {where}; every watched file is read again "
        "from its start (stream ids come from content, so the aggregator drops what it "
        "already had as duplicates)"
    ]


def _load_v1(path: Path, doc: dict[str, object]) -> tuple[FollowState, list[str]]:
    """Version 1: ``files: {path: {generation, dev, ino, head, acked_seq, time_offset_ms}}``.

    Its ``head`` digests only the first 64 bytes; such an entry is trusted on that check
    once, and from then on carries a full fingerprint.
    """
    state = FollowState()
    problems: list[str] = []
    files = doc.get("files")
    for p, raw in (files if isinstance(files, dict) else {}).items():
        e = raw if isinstance(raw, dict) else {}
        gen, dev, ino, acked = (e.get(k) for k in ("generation", "dev", "ino", "acked_seq"))
        head, off = e.get("head"), e.get("time_offset_ms")
        if not (
            isinstance(gen, int)
            and isinstance(dev, int)
            and isinstance(ino, int)
            and isinstance(acked, int)
            and isinstance(head, str)
        ):
            problems.append(f"{path}: entry {p!r}: damaged; that file starts afresh")
            continue
        stream = f"{p}@{gen}"
        state.streams[stream] = Resume(
            stream,
            str(p),
            dev,
            ino,
            length=0,
            sha1=LEGACY_PREFIX + head,
            acked_seq=acked,
            time_offset_ms=off if isinstance(off, int) else None,
        )
        state.next_generation = max(state.next_generation, gen + 1)
    return state, problems
