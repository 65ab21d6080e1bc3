"""``--shift`` and ``--align-at`` of ``fiomon compare``, read into :class:`AlignPoint`s.

Offsets add their pieces (``+1m30s`` is 90 s). A time of day ``HH:MM:SS[.fff]`` is in this
machine's time zone (``TZ=UTC fiomon compare ...`` for UTC), on the date the run covers
(:func:`time_of_day_at`, from the run's first stamp); an ISO datetime without a zone is
local too.
"""

from __future__ import annotations

import datetime as dt
import re

from fiomon.offline.compare.model import AlignPoint

RUNS = ("baseline", "candidate")

_PIECE = re.compile(r"(\d+(?:\.\d+)?)(ms|min|h|m|s)?")
_DURATION = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|min|h|m|s)?)+")
_TIME_OF_DAY = re.compile(r"(\d{1,2}):(\d{2}):(\d{2})(?:\.(\d{1,3}))?")
_UNIT_MS = {"ms": 1, "s": 1000, "min": 60_000, "m": 60_000, "h": 3_600_000, None: 1000}


def duration_ms(text: str) -> int | None:
    """``95s``, ``1m30s``, ``250ms``, ``1.5s`` or a bare number of seconds, in ms (None: not one).

    Pieces add up (``1m30s`` = 90 s); a bare number is seconds only alone.
    """
    t = text.strip().lower()
    if not t or _DURATION.fullmatch(t) is None:
        return None
    pieces = _PIECE.findall(t)
    if len(pieces) > 1 and any(not unit for _, unit in pieces):
        return None
    value = sum(float(n) * _UNIT_MS[u or None] for n, u in pieces)
    return round(value) if value == round(value) else None


def parse_shift(text: str) -> int:
    """``--shift``: a duration, negative allowed (``-30s``), in ms.

    Raises:
        ValueError: not a duration.
    """
    t = text.strip()
    sign = -1 if t.startswith("-") else 1
    ms = duration_ms(t.lstrip("+-"))
    if ms is None:
        msg = f"--shift: {text!r} is not a duration (try 5s, -30s, 1m30s)"
        raise ValueError(msg)
    return sign * ms


_TIME_OF_DAY = re.compile(r"(\d{1,2}):(\d{2}):(\d{2})(?:\.(\d{1,3}))?")


def parse_point(text: str) -> AlignPoint | None:
    """One side of ``--align-at`` (None: not a time)."""
    t = text.strip()
    if t.startswith("+"):
        ms = duration_ms(t[1:])
        return None if ms is None else AlignPoint(offset_ms=ms)
    m = _TIME_OF_DAY.fullmatch(t)
    if m is not None:
        h, mi, s, frac = m.groups()
        if int(h) > 23 or int(mi) > 59 or int(s) > 59:
            return None
        ms = ((int(h) * 60 + int(mi)) * 60 + int(s)) * 1000 + int((frac or "0").ljust(3, "0"))
        return AlignPoint(time_of_day_ms=ms)
    try:
        when = dt.datetime.fromisoformat(t)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.astimezone()  # a naive time is the local zone's, as HH:MM:SS is
    return AlignPoint(epoch_ms=round(when.timestamp() * 1000))


def parse_align_at(text: str) -> tuple[AlignPoint, AlignPoint]:
    """``baseline=T,candidate=T``: the baseline's point and the candidate's.

    Raises:
        ValueError: malformed; the message says what is expected.
    """
    usage = (
        "--align-at: expected baseline=T,candidate=T, T a wall-clock time HH:MM:SS[.fff], "
        f"an ISO datetime or an offset such as +95s from the run's start; got {text!r}"
    )
    found: dict[str, AlignPoint] = {}
    for part in text.split(","):
        name, eq, value = part.partition("=")
        name = name.strip().lower()
        point = parse_point(value) if eq else None
        if name not in RUNS or name in found or point is None:
            raise ValueError(usage)
        found[name] = point
    if set(found) != set(RUNS):
        raise ValueError(usage)
    return found["baseline"], found["candidate"]


def time_of_day_at(tod_ms: int, first_ms: int) -> int:
    """The first instant at or after the run's start (less a minute) at that time of day."""
    first = dt.datetime.fromtimestamp(first_ms / 1000).astimezone()
    midnight = first.replace(hour=0, minute=0, second=0, microsecond=0)
    at = int(midnight.timestamp() * 1000) + tod_ms
    return at if at >= first_ms - 60_000 else at + 86_400_000
