"""Generated blocks in README.md and docs/**/*.md: the registry of tables and the machinery that checks and
rewrites each block from its JSON. The tables themselves are in tables.py.

A generated block in a markdown file is

    <!-- generated: NAME -->
    | ... the table TABLES[NAME] renders ... |
    <!-- end generated -->
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
BLOCK = re.compile(r"(<!-- generated: (?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.DOTALL)
FIX = "python benchmarks/tables/tables.py --write"

# name -> (JSON files, as paths under benchmarks/ such as "demo/demo-cpu.json", render function taking their
# parsed contents in that order)
TABLES: dict[str, tuple[tuple[str, ...], Callable[..., str]]] = {}


def table(name: str, *files: str):
    def register(render):
        TABLES[name] = (files, render)
        return render
    return register


def render(name: str) -> str:
    files, fn = TABLES[name]
    return fn(*(json.loads((BENCH / f).read_text()) for f in files))


def documents(root: Path = ROOT) -> list[Path]:
    """The markdown files whose generated blocks this module owns: README.md and docs/**/*.md."""
    return [p for p in [root / "README.md", *sorted((root / "docs").rglob("*.md"))] if p.is_file()]


def blocks(text: str) -> list[tuple[str, str]]:
    """(name, body) of every generated block in ``text``."""
    return [(m["name"], m["body"]) for m in BLOCK.finditer(text)]


def rewrite(text: str) -> str:
    """``text`` with every generated block's body replaced by its table (unknown names left as they are)."""
    return BLOCK.sub(lambda m: m[1] + render(m["name"]) + "\n" + m[4] if m["name"] in TABLES else m[0], text)


def check(root: Path = ROOT) -> list[str]:
    """One line per block that is unknown or differs from what its JSON gives; empty when all agree."""
    problems = []
    for path in documents(root):
        rel = path.relative_to(root)
        for name, body in blocks(path.read_text()):
            if name not in TABLES:
                problems.append(f"{rel}: block '{name}' names no table (known: {', '.join(TABLES)})")
            elif body != render(name) + "\n":
                files = ", ".join(f"benchmarks/{f}" for f in TABLES[name][0])
                problems.append(f"{rel}: block '{name}' differs from {files}; run `{FIX}`")
    return problems


def write(root: Path = ROOT) -> list[Path]:
    changed = []
    for path in documents(root):
        text = path.read_text()
        if (new := rewrite(text)) != text:
            path.write_text(new)
            changed.append(path)
    return changed
