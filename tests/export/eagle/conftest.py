"""Bundles with an EAGLE-3 head, built once for the test session: test_eagle_export.py checks their graphs,
test_eagle_export_checks.py quantizes them and feeds them bad heads."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from support.eagle_export_cases import DRAFT_VOCAB, EXPLICIT_TAPS, HIDDEN, LAYERS
from support.models import make_tokenizer, save_eagle_head, save_model

from specrt.cli import main
from specrt.export.exporter import export_bundle


@pytest.fixture(scope="session")
def sources(tmp_path_factory):
    """A llama target and draft sharing a tokenizer, a head with shuffled (non-ascending) draft ids, and
    one with ascending ids, explicit taps and its own embedding table, narrower than the target."""
    root = tmp_path_factory.mktemp("eagle-src")
    tok = make_tokenizer()
    target = save_model(root / "target", "llama", seed=1, layers=LAYERS, hidden=HIDDEN, tokenizer=tok)
    draft = save_model(root / "draft", "llama", seed=2, layers=1, hidden=32, heads=2, kv_heads=1, tokenizer=tok)
    shuffled = save_eagle_head(root / "head-shuffled", target, seed=3, draft_vocab=DRAFT_VOCAB, ascending=False)
    ascending = save_eagle_head(root / "head-ascending", target, seed=4, draft_vocab=DRAFT_VOCAB, hidden=48,
                                embedding=True, taps=EXPLICIT_TAPS)
    return {"target": target, "draft": draft, "shuffled": shuffled, "ascending": ascending, "root": root}


@pytest.fixture(scope="session")
def fused_bundle(sources, tmp_path_factory):
    """The default export (dynamo, fused graphs on llama) of the target with the shuffled head."""
    out = tmp_path_factory.mktemp("eagle-fused") / "bundle"
    export_bundle(str(sources["target"]), None, out, eagle=str(sources["shuffled"]))
    return out


@pytest.fixture(scope="session")
def portable_bundle(sources, tmp_path_factory):
    """Through the CLI: target + draft + the ascending head, plain-op graphs traced by torchscript."""
    out = tmp_path_factory.mktemp("eagle-portable") / "bundle"
    res = CliRunner().invoke(main, ["export", str(sources["target"]), "--draft", str(sources["draft"]), "--eagle",
                                    str(sources["ascending"]), "--graph", "portable", "--exporter", "torchscript",
                                    "--quantize", "none", "--no-measure", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "EAGLE-3 head (portable graph) reading target layers 1, 3, 4" in res.output
    assert "eagle_taps from layers 1, 3, 4" in res.output
    return out
