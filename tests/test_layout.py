"""The layout's rules, checked on the import graph (every import statement, lazy ones inside functions too).

- ``runtime/`` imports only ``bundle/``, ``errors``, ``theory``, the demo bundle's path and itself: never the
  torch side (``export/``), measurement, diagnostics, the server or the demo's training code;
- ``bundle/`` imports only the leaves (it is what both sides share);
- ``export/`` never imports ``measure/``, ``check/`` or ``serve/``;
- ``measure/`` and ``check/`` never import ``export/`` (they read bundles through the runtime);
- nothing but ``cli`` imports ``cli``;
- no import circle anywhere in the package (module by module), nor between ``export/``'s rooms (each sub-package
  and each top-level module one node), so every room has a floor: graph/ and quant/ below eagle/, the orchestrators
  (pipeline, exporter, torch_backend) on top. docs/design/house.md draws the map.
A runtime backend that lives on the torch side is registered by its dotted name, not imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "specrt"

LEAVES = {"specrt", "specrt.errors", "specrt.theory", "specrt.data"}
RULES = {  # room -> rooms it may import besides itself and the leaves
    "runtime": {"bundle", "demo"},  # demo: the shipped bundle's path only (its training is in export/demo)
    "bundle": set(),
    "export": {"bundle", "runtime", "demo"},
    "measure": {"bundle", "runtime"},
    "check": {"bundle", "runtime", "measure"},
    "serve": {"bundle", "runtime", "demo"},
    "demo": set(),
}


def _module(path: Path, package: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, root: Path) -> set[str]:
    """Absolute names of every specrt module or package ``path`` imports, at any depth."""
    module = _module(path, root)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "specrt")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base.split(".")[0] != "specrt":
                continue
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)  # `from . import x` may name a module
    return found


def _room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _violations(root: Path = PACKAGE) -> list[str]:
    known = {_module(p, root) for p in root.rglob("*.py")}
    bad = []
    for path in sorted(root.rglob("*.py")):
        src = _module(path, root)
        room = _room(src)
        if room not in RULES:
            continue
        for target in sorted(_imports(path, root)):
            if target not in known and target.rsplit(".", 1)[0] in known:
                continue  # an attribute (`from .x import name`), counted by its module
            if target in LEAVES or target.startswith("specrt.errors") or target.startswith("specrt.data"):
                continue
            other = _room(target)
            if other is None or other == room:
                continue
            if other == "cli" or other not in RULES[room]:
                bad.append(f"{src} imports {target}")
    return bad


def test_rooms_import_only_what_the_layout_allows():
    assert _violations() == []


def test_the_checker_sees_lazy_and_relative_imports(tmp_path):
    """The rule is only worth something if a lazy relative import up the layers is caught."""
    fake = tmp_path / "specrt"
    (fake / "runtime").mkdir(parents=True)
    (fake / "export").mkdir()
    for f in ("__init__.py", "runtime/__init__.py", "export/__init__.py", "export/exporter.py"):
        (fake / f).write_text("")
    (fake / "runtime" / "loop.py").write_text("def f():\n    from ..export.exporter import export_bundle\n")
    assert _violations(fake) == ["specrt.runtime.loop imports specrt.export.exporter"]


@pytest.mark.parametrize("room", ["bench", "plan", "roofline", "bandwidth", "energy", "report", "doctor",
                                  "checks", "contract", "manifest", "logit_parity", "progress"])
def test_nothing_loose_at_the_top_of_the_package(room):
    assert not (PACKAGE / f"{room}.py").exists()


def test_the_runtime_does_not_import_torch_or_the_demo_training(tmp_path):
    """Loading and running the shipped demo pulls in none of torch, transformers, onnx or specrt.export."""
    import subprocess
    import sys

    code = ("import sys, specrt; g = specrt.load(threads=1); g.generate('def f():', max_new_tokens=4); "
            "bad = [m for m in ('torch', 'transformers', 'onnx', 'specrt.export', 'specrt.measure', 'specrt.serve') "
            "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_demo_package_is_the_shipped_bundle_and_its_path_only():
    """The runtime and the server import ``specrt.demo`` for the bundle's path: no training code may live there."""
    assert sorted(p.name for p in (PACKAGE / "demo").glob("*.py")) == ["__init__.py"]
    assert "torch" not in (PACKAGE / "demo" / "__init__.py").read_text()


def _graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """{module: the specrt modules it imports}, an attribute import counted by its module, a package's own
    ``__init__`` left out (importing ``a.b`` runs ``a`` first: that is no dependency on ``a``'s contents)."""
    known = {_module(p, root) for p in root.rglob("*.py")}
    graph = {}
    for path in root.rglob("*.py"):
        src = _module(path, root)
        deps = set()
        for target in _imports(path, root):
            target = target if target in known else target.rsplit(".", 1)[0]
            if target in known and target != src and not src.startswith(target + "."):
                deps.add(target)
        graph[src] = deps
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _export_rooms(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """``export/``'s import graph with each sub-package one node (``specrt.export.eagle`` for all of eagle/)."""
    def room(m: str) -> str | None:
        parts = m.split(".")
        return ".".join(parts[:3]) if parts[:2] == ["specrt", "export"] and len(parts) > 2 else None

    rooms: dict[str, set[str]] = {}
    for src, deps in graph.items():
        a = room(src)
        if a is not None:
            rooms.setdefault(a, set()).update(b for b in map(room, deps) if b is not None and b != a)
    return rooms


def test_no_import_circles():
    assert _circles(_graph()) == []


def test_export_rooms_form_no_circle_and_its_top_level_stays_small():
    assert _circles(_export_rooms(_graph())) == []
    top = sorted(p.name for p in (PACKAGE / "export").iterdir() if not p.name.startswith((".", "__")))
    assert len(top) <= 16, top  # the rooms and modules of ../shared/notes/layout.md's shape, dflash/ included


def test_the_circle_finder_sees_a_lazy_circle(tmp_path):
    fake = tmp_path / "specrt"
    (fake / "export" / "quant").mkdir(parents=True)
    for f in ("__init__.py", "export/__init__.py", "export/quant/__init__.py", "export/staging.py"):
        (fake / f).write_text("")
    (fake / "export" / "quant" / "gguf.py").write_text("from ..staging import save\n")
    (fake / "export" / "quant" / "quantize.py").write_text("from .gguf import keep\n")
    assert _circles(_graph(fake)) == [] and _circles(_export_rooms(_graph(fake))) == []
    (fake / "export" / "staging.py").write_text("def f():\n    from .quant.quantize import x\n")
    assert _circles(_export_rooms(_graph(fake))) == [["specrt.export.quant", "specrt.export.staging"]]
    (fake / "export" / "quant" / "gguf.py").write_text("def f():\n    from .quantize import x\n")
    assert _circles(_graph(fake))[0] == ["specrt.export.quant.gguf", "specrt.export.quant.quantize"]
