"""docs/cli.md is the commands' own --help, regenerated here: a help text changed without the reference
(or the reference edited by hand) fails CI. Also: help texts that name what the code does say it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import click

from specrt.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _reference_module():
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "scripts" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_cli_md_is_the_generated_reference():
    ref = _reference_module()
    assert ref.OUT.is_file(), "docs/cli.md is missing: run python scripts/cli_reference.py"
    assert ref.OUT.read_text() == ref.render(), "docs/cli.md differs from the commands' --help: " \
                                                "run python scripts/cli_reference.py"


def test_the_reference_holds_every_command_and_does_not_depend_on_the_terminal(monkeypatch):
    ref = _reference_module()
    text = ref.render()
    monkeypatch.setenv("COLUMNS", "40")
    assert ref.render() == text
    paths = [line[3:] for line in text.splitlines() if line.startswith("## ")]
    assert paths[0] == "specrt" and "specrt medusa train" in paths
    assert {p.split()[1] for p in paths[1:]} == set(main.commands)


def test_graph_help_names_the_fused_architectures():
    from specrt.export.graph.architectures import adapter_for, supported_model_types

    ctx = click.Context(main.commands["export"], info_name="export", terminal_width=1000)
    help_text = main.commands["export"].get_help(ctx)
    auto = help_text[help_text.index("auto: fused where"):]
    fused = [t for t in supported_model_types() if adapter_for(t).supports_fused]
    assert fused and all(t in auto.split("with the dynamo")[0] for t in fused)
    assert all(t not in auto.split(":")[1] for t in supported_model_types() if t not in fused), auto


def test_shared_options_are_written_once():
    """--bundle, the sampling options and --method read the same wherever they appear."""
    helps: dict[str, set[str]] = {}
    for name in ("run", "bench", "verify", "build", "serve"):
        for p in main.commands[name].params:
            helps.setdefault(p.name, set()).add(p.help or "")
    for name in ("bundle", "temperature", "top_k", "top_p", "gamma", "tree_shape", "threads", "backend"):
        assert len(helps[name]) == 1, (name, helps[name])
    for name in ("run", "serve"):
        (method,) = [p for p in main.commands[name].params if p.name == "method"]
        assert method.default == "auto" and "auto" in method.type.choices
        assert "the best the bundle holds (eagle-tree, else draft, else ngram)" in method.help
