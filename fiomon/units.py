"""Quantities with units, as the configuration files and the command line write them.

Each parser takes what the user wrote (``what`` names the key or flag for the message)
and returns an integer or float in the base unit its name carries: durations in ms
(``1s``, ``250ms``, ``2m``), sizes in bytes (``64MiB``, ``1GB``), latencies in ns
(``5ms``, ``500us``). Every failure is a :class:`~fiomon.errors.ConfigError` with one
message that starts with ``what``.
"""

from __future__ import annotations

import re

from fiomon.errors import ConfigError

_DURATION_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000}


def parse_duration_ms(text: str, *, what: str) -> int:
    """Parse ``1s``, ``250ms``, ``2m``, ``1.5s`` or a bare number of seconds, to ms.

    Raises:
        ConfigError: the text is no duration or not a whole number of ms.
    """
    t = text.strip().lower()
    for suffix in sorted(_DURATION_UNITS, key=len, reverse=True):
        if t.endswith(suffix):
            number, scale = t[: -len(suffix)], _DURATION_UNITS[suffix]
            break
    else:
        number, scale = t, 1000
    try:
        value = float(number) * scale
    except ValueError:
        msg = f"{what}: {text!r} is not a duration (try 1s, 250ms, 2m)"
        raise ConfigError([msg]) from None
    if value < 0 or value != round(value):
        msg = f"{what}: {text!r} must be a non-negative whole number of milliseconds"
        raise ConfigError([msg])
    return round(value)


_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: object, *, what: str) -> int:
    """Bytes from ``65536``, ``256KiB``, ``64MiB`` or ``1GB``.

    Raises:
        ConfigError: not a size.
    """
    if isinstance(value, bool):
        msg = f"{what}: expected a size such as 64MiB, got {value!r}"
        raise ConfigError([msg])
    if isinstance(value, int):
        if value < 0:
            msg = f"{what}: must not be negative, got {value}"
            raise ConfigError([msg])
        return value
    m = _SIZE_RE.match(str(value))
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _SIZE_UNITS:
        msg = f"{what}: expected a size such as 64MiB or 256KiB, got {value!r}"
        raise ConfigError([msg])
    return round(float(m.group(1)) * _SIZE_UNITS[unit])


_LATENCY_UNITS = {"ns": 1.0, "us": 1e3, "µs": 1e3, "ms": 1e6, "s": 1e9}


def parse_latency_ns(value: object, *, what: str) -> float:
    """A positive latency with units (``5ms``, ``500us``, ``2s``) in ns.

    Raises:
        ConfigError: no positive number with a unit.
    """
    text = str(value).strip().lower()
    # "s" last: "5ms" also ends with "s".
    for suffix in ("ns", "us", "µs", "ms", "s"):
        if text.endswith(suffix):
            try:
                v = float(text[: -len(suffix)]) * _LATENCY_UNITS[suffix]
            except ValueError:
                break
            if v > 0:
                return v
            break
    msg = f"{what}: expected a latency with units such as 5ms or 500us, got {value!r}"
    raise ConfigError([msg])


_SCALES = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}


def format_latency_ns(
    ns: float | None,
    unit: str | None = None,
    *,
    largest: str = "s",
    width: int = 0,
    fixed: bool = False,
) -> str:
    """A latency in ns as fiomon prints it.

    Args:
        ns: the latency; None (unknown) gives ``-``.
        unit: None: the largest unit (``ns``, ``us``, ``ms``, ``s``, up to ``largest``)
            the value reaches, 3 significant digits and the unit's name (``850 ns``,
            ``1.23 ms``); a unit: the number alone in that unit.
        largest: the largest unit chosen when ``unit`` is None.
        width: right-aligned in at least this many characters.
        fixed: with ``unit``: 3 decimals below 100 and 1 from there (a table's columns)
            instead of 3 significant digits.
    """
    if ns is None:
        return "-".rjust(width)
    if unit is None:
        top = _SCALES[largest]
        unit = next((u for u in ("s", "ms", "us") if _SCALES[u] <= top and ns >= _SCALES[u]), "ns")
        return f"{ns / _SCALES[unit]:.3g} {unit}".rjust(width)
    v = ns / _SCALES[unit]
    if fixed:
        return f"{v:.{3 if v < 100 else 1}f}".rjust(width)
    return f"{v:{width}.3g}"
