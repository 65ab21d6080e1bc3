"""Shipped docs, deploy files and code cite only files that exist in the project.

The wheel installs README.md, ``docs/``, ``config/``, ``deploy/`` and ``agents/`` under
``share/fiomon/`` and the package's own comments and help texts with the code: a file
they name that is not in the repository (an author's notes such as REFERENCE.md) is a
dead end for the reader. Checked: Markdown links, any ``*.md`` named, and any path that
starts with one of the project's top-level folders, relative to the citing file's folder
or to the repository's root.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("README.md", "agents", "config", "deploy", "docs", "fiomon")
TEXT_SUFFIXES = {"", ".md", ".py", ".js", ".html", ".yaml", ".yml", ".json", ".conf", ".acl"}
TEXT_SUFFIXES |= {".service", ".fio", ".txt", ".cfg", ".j2", ".ini", ".sh"}

LINK = re.compile(r"\]\(([^)\s]+)\)")
MARKDOWN_FILE = re.compile(r"(?<![\w/.-])([\w./-]*\w\.md)\b")
TOP_FOLDERS = "deploy|config|docs|agents|scripts|tests|benchmarks|fiomon"
PROJECT_PATH = re.compile(rf"(?<![\w/.<>{{$~@-])((?:\.\./)*(?:{TOP_FOLDERS})/[\w./-]*[\w/])")
# Files a build writes (scripts/release): not in the checkout, in every artifact.
GENERATED = {"fiomon/REVISION"}
# The authors' notes, which do not ship, cited by name without a suffix.
UNSHIPPED_NOTES = re.compile(r"\b(?:REFERENCE|DESIGN|STYLE)\b(?:\.md)?")


def shipped_files() -> list[Path]:
    out: list[Path] = []
    for name in SHIPPED:
        top = ROOT / name
        found = [top] if top.is_file() else sorted(top.rglob("*"))
        out += [
            p
            for p in found
            if p.is_file()
            and p.suffix in TEXT_SUFFIXES
            and "vendor" not in p.parts
            and "__pycache__" not in p.parts
        ]
    return out


def cited(text: str) -> list[tuple[int, str]]:
    """(line, target) of every file reference in ``text`` (a link may be found twice)."""
    out = []
    for rx in (LINK, MARKDOWN_FILE, PROJECT_PATH):
        for m in rx.finditer(text):
            target = m.group(1).split("#", 1)[0]
            if not target or re.match(r"[a-z][a-z0-9+.-]*:", target):  # a URL
                continue
            if target.startswith(("/", "fiomon/v1/", "fiomon/v1")):  # a host path, a topic
                continue
            if target in GENERATED:
                continue
            out.append((text.count("\n", 0, m.start()) + 1, target))
    return out


def test_every_file_a_shipped_file_cites_exists() -> None:
    files = shipped_files()
    assert len(files) > 50  # the walk found the tree
    missing = []
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        for line, target in cited(text):
            if not any((base / target).exists() for base in (path.parent, ROOT)):
                missing.append(f"{path.relative_to(ROOT)}:{line}: {target}")
    assert not missing, "cited but not in the project:\n" + "\n".join(missing)


def test_no_shipped_file_cites_the_authors_notes() -> None:
    hits = []
    for path in shipped_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for m in UNSHIPPED_NOTES.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            hits.append(f"{path.relative_to(ROOT)}:{line}: {m.group(0)}")
    assert not hits, "notes that do not ship:\n" + "\n".join(hits)


def test_the_checker_sees_a_dangling_reference() -> None:
    text = (
        "See [the metrics](docs/metrics.md#series), REFERENCE.md §5, deploy/nope.conf,\n"
        "topics fiomon/v1/+/records and /etc/fiomon/agent.yaml, https://x.example/a.md.\n"
    )
    found = set(cited(text))
    assert found == {(1, "docs/metrics.md"), (1, "REFERENCE.md"), (1, "deploy/nope.conf")}
    assert UNSHIPPED_NOTES.search(text)
