"""Reading a configuration file: strict YAML (no duplicate keys, no aliases), bounded.

Apart from :mod:`fiomon.config` so that PyYAML is loaded only when a file is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from fiomon.errors import ConfigError


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error.

    Plain ``safe_load`` keeps the last value silently: ``port: 1883`` followed further
    down by ``port: 8883`` would run with a setting the reader never noticed.
    """

    duplicates: list[str]

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        # Aliases (``*name``) can expand a few hundred bytes into gigabytes ("billion
        # laughs"); a fiomon configuration never needs them.
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            mark = event.start_mark
            msg = "aliases (*name) are not allowed in a fiomon configuration"
            raise yaml.composer.ComposerError(None, None, msg, mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                dup = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: PyYAML reports it itself
                continue
            if dup:
                line = key_node.start_mark.line + 1
                self.duplicates.append(f"line {line}: key {key!r} given twice")
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Path, max_bytes: int) -> object:
    """The YAML document in ``path``.

    Raises:
        ConfigError: unreadable, not text, too large, not YAML (with the line of the
            syntax error), or a key given twice in one mapping.
    """
    data, duplicates = read_yaml_noting_duplicates(path, max_bytes)
    if duplicates:
        raise ConfigError(duplicates)
    return data


def read_yaml_noting_duplicates(path: Path, max_bytes: int) -> tuple[object, list[str]]:
    """The YAML document in ``path`` and its keys given twice (each keeps its last value).

    One ``path: line N: key 'k' given twice`` problem per such key, for ``fiomon
    check-config``, which lists a duplicate with every other problem.

    Raises:
        ConfigError: unreadable, not text, too large, not YAML (with the line of the
            syntax error), or empty.
    """
    try:
        with path.open("rb") as fh:
            raw = fh.read(max_bytes + 1)
    except OSError as exc:
        msg = f"{path}: cannot read ({exc.strerror or exc})"
        raise ConfigError([msg]) from exc
    if len(raw) > max_bytes:
        msg = f"{path}: larger than {max_bytes} bytes; not a fiomon configuration"
        raise ConfigError([msg])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        msg = f"{path}: not a text file (byte {exc.start} is not UTF-8)"
        raise ConfigError([msg]) from exc
    if "\x00" in text:
        msg = f"{path}: not a text file (it holds NUL bytes)"
        raise ConfigError([msg])
    loader = _StrictLoader(text)
    loader.duplicates = []
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        msg = f"{where}: not valid YAML ({getattr(exc, 'problem', None) or exc})"
        raise ConfigError([msg]) from exc
    except RecursionError as exc:
        msg = f"{path}: not a fiomon configuration (nested too deeply)"
        raise ConfigError([msg]) from exc
    finally:
        loader.dispose()
    if data is None:
        msg = f"{path}: empty (no settings at all): is this the right file?"
        raise ConfigError([msg])
    return data, [f"{path}: {d}" for d in loader.duplicates]
