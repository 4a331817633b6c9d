"""The layout's rules, checked on the import graph (every import statement, lazy ones inside functions too).

- ``runtime/`` imports only ``bundle/``, ``errors``, ``theory``, the demo bundle's path and itself: never the
  torch side (``export/``), measurement, diagnostics, the server or the demo's training code;
- ``bundle/`` imports only the leaves (it is what both sides share);
- ``export/`` never imports ``measure/``, ``check/`` or ``serve/``;
- ``measure/`` and ``check/`` never import ``export/`` (they read bundles through the runtime);
- nothing but ``cli`` imports ``cli``.
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
    for f in ("__init__.py", "runtime/__init__.py", "export/__init__.py", "export/bundle.py"):
        (fake / f).write_text("")
    (fake / "runtime" / "loop.py").write_text("def f():\n    from ..export.bundle import export_bundle\n")
    assert _violations(fake) == ["specrt.runtime.loop imports specrt.export.bundle"]


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
