"""The package's seams: which side may import which (issue 13).

The core (flat modules of ``fiomon``) is shared; ``agent``, ``aggregator``, ``root`` and
``offline`` each build on it and never on one another, and the core imports none of them.
``server`` is the one service shell (start-up, stop, state, publication) that the two
mergers, ``aggregator`` and ``root``, plug into: both may import it, it imports neither,
and no other side uses it. ``tools``
(demo, simulator, ``fiomon fio``) and ``cli`` sit on top and may use anything. Checked on
the source (every ``import``/``from`` statement, lazy ones inside functions included) and,
for the modules a user imports alone, in a fresh interpreter.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "fiomon"
SIDES = ("agent", "aggregator", "root", "server", "offline", "tools")
# side -> the sides it must not import
FORBIDDEN = {
    "core": {"agent", "aggregator", "root", "server", "offline", "tools"},
    "agent": {"aggregator", "root", "server", "offline", "tools"},
    "aggregator": {"agent", "root", "offline", "tools"},
    "root": {"agent", "aggregator", "offline", "tools"},
    "server": {"agent", "aggregator", "root", "offline", "tools"},
    "offline": {"agent", "aggregator", "root", "server", "tools"},
}
ALLOWED: set[tuple[str, str]] = set()  # crossings allowed for a while (none today)
TOP = {"cli", "__main__", "__init__"}  # the command line wires every side together


def _side(module: str) -> str:
    """The side of ``fiomon.x[.y]``: one of :data:`SIDES`, else ``core``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in SIDES else "core"


def _imports(path: Path) -> set[str]:
    """Every fiomon module ``path`` imports, at any depth of the file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fiomon"):
            found.add(node.module)
            for alias in node.names:  # from fiomon.agent import follow
                found.add(f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("fiomon")}
    return {m for m in found if _exists(m)}


def _exists(module: str) -> bool:
    rel = Path(*module.split(".")[1:])
    return (PKG / rel).with_suffix(".py").exists() or (PKG / rel / "__init__.py").exists()


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        out.append((".".join(["fiomon", *parts]), path))
    return out


@pytest.mark.parametrize(("module", "path"), _modules(), ids=[m for m, _ in _modules()])
def test_no_side_imports_another(module: str, path: Path) -> None:
    # The top: cli, __main__ and the package's own __init__ (its lazy offline API).
    if path.stem in TOP and _side(module) == "core":
        return
    side = _side(module)
    bad = sorted(
        m
        for m in _imports(path)
        if _side(m) in FORBIDDEN.get(side, set()) and (side, m) not in ALLOWED
    )
    assert not bad, f"{module} ({side}) imports {bad}"


@pytest.mark.parametrize(
    ("module", "absent"),
    [
        ("fiomon.offline.summary", "prometheus_client"),  # offline needs no exporter
        ("fiomon.offline.report", "aiomqtt"),
        ("fiomon.server.alerts", "yaml"),  # rules are data; YAML is the loader's
        ("fiomon.wire", "aiomqtt"),
        # The root's merge and the partials format are pure logic: no MQTT client.
        ("fiomon.partials", "aiomqtt"),
        ("fiomon.root.merger", "aiomqtt"),
        ("fiomon.root.merger", "paho"),
        ("fiomon.cells", "paho"),
    ],
)
def test_modules_import_alone_without_what_they_do_not_need(module: str, absent: str) -> None:
    code = f"import sys, {module}; print({absent!r} in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False", f"importing {module} loads {absent}"


LIBRARY_API = {
    # The model, layouts and the quantum engine.
    "BinLayout",
    "detect_layout",
    "merged_layout",
    "RecordBatch",
    "StreamInfo",
    "Direction",
    "QuantumEngine",
    "ClosedQuantum",
    "HistStats",
    "summarize",
    "pct_key",
    # Parsers of fio's outputs.
    "sniff",
    "open_parser",
    "RecordParser",
    "HistLogParser",
    "HistLogOptions",
    "JsonStatusParser",
    # Closed quanta from files.
    "iter_quanta",
    "QuantaOptions",
    # The wire format.
    "encode",
    "decode",
    "Message",
    # Errors.
    "FiomonError",
    "ConfigError",
    "LayoutError",
    "ParseError",
    "OverlapError",
    "WireFormatError",
}


def test_the_package_exports_the_library_api_and_loads_no_service_code() -> None:
    # In a fresh interpreter: `import fiomon` alone loads no MQTT, no Prometheus client and
    # no side package; `from fiomon import *` then gives every name of the API (the
    # offline ones loaded on first use).
    code = (
        "import sys, json, fiomon\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('aiomqtt', 'paho', 'prometheus_client', 'yaml') or m.split('.')[:2] in "
        "(['fiomon', 'agent'], ['fiomon', 'aggregator'], ['fiomon', 'root'], "
        "['fiomon', 'server'], ['fiomon', 'offline'], ['fiomon', 'tools']))\n"
        "ns = {}\n"
        "exec('from fiomon import *', ns)\n"
        "print(json.dumps([heavy, sorted(k for k in ns if not k.startswith('__'))]))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    heavy, names = json.loads(r.stdout)
    assert heavy == [], f"import fiomon loads {heavy}"
    assert set(names) >= LIBRARY_API, f"missing: {sorted(LIBRARY_API - set(names))}"
    import fiomon  # noqa: PLC0415 - after the fresh-interpreter check, in this one

    assert set(fiomon.__all__) - {"__version__"} == LIBRARY_API
    assert callable(fiomon.iter_quanta)


def test_the_readme_layout_is_the_tree() -> None:
    """README's Layout names every module of the package, and no module that is gone."""
    readme = (PKG.parent / "README.md").read_text()
    layout = readme.split("## Layout\n\n```\n", 1)[1].split("```", 1)[0]
    block = layout.split("\ntests/", 1)[0]  # the package's part
    named = set(re.findall(r"\b([a-z_]+\.py)\b", block))
    have = {p.name for p in PKG.rglob("*.py") if not p.name.startswith("_")}
    assert have - named == set(), "modules the Layout does not name"
    assert named - have == set(), "the Layout names modules that do not exist"
    packages = {p.parent.name for p in PKG.rglob("__init__.py") if p.parent != PKG}
    assert {p for p in packages if f"{p}/" not in block} == set(), "packages missing"
