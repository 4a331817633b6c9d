"""A manifest's every field is typed and in range, its dims are its graphs', its ids address the target's
vocabulary, and what a graph does at run time that the manifest could not tell is one line: each bad manifest is
refused by `specrt.load` and `specrt run` in one line naming the field or the graph, never a traceback."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import specrt
from specrt import demo
from specrt.bundle.manifest import MedusaEntry, load_manifest
from specrt.cli import main
from specrt.errors import BundleError


def _copy(bundle: Path, tmp_path: Path) -> Path:
    """A copy of ``bundle`` whose files are hard links where the file system allows (the demo's graphs are 67 MB);
    only the manifest and tokenizer are ever rewritten, and each is replaced, not written through the link."""
    out = tmp_path / "bundle"

    def link(src, dst):
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(bundle, out, copy_function=link)
    return out


def _replace(path: Path, text: str) -> None:
    path.unlink()
    path.write_text(text)


def _change(bundle: Path, change) -> None:
    m = json.loads((bundle / "specrt.json").read_text())
    change(m)
    _replace(bundle / "specrt.json", json.dumps(m))  # json writes inf as Infinity, as a hostile file may


def _target(**fields):
    return lambda m: m["models"]["target"].update(fields)


def _dims(role, **dims):
    return lambda m: m["models"][role]["dims"].update(dims)


def _tokenizer(**fields):
    return lambda m: m["tokenizer"].update(fields)


BAD = {  # on 53d09c5 each of these was a 17-40 line traceback, or loaded and did something else
    "a draft vocabulary differing from its graph's": (_dims("draft", vocab_size=336),
                                                      "draft.onnx: its output logits is [batch, logits_rows, 352]"),
    "a target vocab_size the graph does not have": (_dims("target", vocab_size=400), "target.onnx: its output logits"),
    "a target head_dim the graph does not have": (_dims("target", head_dim=8),
                                                  "its input past_key.0 is [batch, past, 2, 16]"),
    "a hidden size the graph does not have": (_dims("target", hidden_size=32), "its output hidden is"),
    "bos_token_id -7": (_tokenizer(bos_token_id=-7), "tokenizer.bos_token_id = -7 is not >= 0"),
    "bos_token_id past the vocabulary": (_tokenizer(bos_token_id=10000), "names id 10000, outside the target's "
                                                                         "vocabulary [0, 336)"),
    'eos_token_ids "1"': (_tokenizer(eos_token_ids="1"), "tokenizer.eos_token_ids must be a list of integers"),
    "an end id past the vocabulary": (_tokenizer(eos_token_ids=[1, 336]), "names id 336"),
    'engines "x"': (lambda m: m.__setitem__("engines", "x"), "engines must be an object"),
    "an engine record without a file": (lambda m: m.__setitem__("engines", {"target": 5}),
                                         "engines.target must be an object"),
    "max_context Infinity": (lambda m: m.__setitem__("max_context", math.inf), "max_context must be an integer"),
    "max_context 100.5": (lambda m: m.__setitem__("max_context", 100.5), "max_context must be an integer"),
    'add_bos_token "no"': (_tokenizer(add_bos_token="no"), "add_bos_token must be true or false"),
    "tap_width Infinity": (_target(tap_width=math.inf), "models.target.tap_width must be an integer"),
    "a role the runtime does not know": (lambda m: m["models"].__setitem__("helper", m["models"]["draft"]),
                                         "models hold 'helper'; a bundle's roles are target, draft, eagle"),
    "heads not a multiple of the KV heads": (_dims("target", num_heads=3), "must be a multiple of num_kv_heads"),
    "a golden id past the vocabulary": (lambda m: m["models"]["target"]["golden"]["top_ids"][0].__setitem__(0, 999),
                                        "models.target.golden.top_ids must be 12 rows of ids in [0, 336)"),
}


def _refused_in_one_line(bundle: Path, message: str, method: str) -> None:
    with pytest.raises(BundleError) as e:
        specrt.load(bundle, threads=1).generate("x", max_new_tokens=2, method=method)
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)
    res = CliRunner().invoke(main, ["run", "x", "--bundle", str(bundle), "--max-new-tokens", "2", "--method", method])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert f"Error: {str(e.value)}" in res.output, res.output


@pytest.mark.parametrize("case", BAD)
def test_a_bad_manifest_is_refused_in_one_line(llama_bundle, tmp_path, case):
    bundle = _copy(llama_bundle, tmp_path)
    change, message = BAD[case]
    _change(bundle, change)
    _refused_in_one_line(bundle, message, "draft")


def _medusa(change):
    return lambda m: change(m["medusa"])


BAD_MEDUSA = {
    "a rank past topk": (_medusa(lambda h: h["tree"].append([10])), "medusa.tree holds [10]: a path is 1 to 3 "
                                                                      "candidate ranks in [0, 10)"),
    "a path deeper than the heads": (_medusa(lambda h: h["tree"].append([0, 0, 0, 0])),
                                     "medusa.tree holds [0, 0, 0, 0]"),
    "a path before its parent": (_medusa(lambda h: h["tree"].insert(0, [0, 0])), "lists [0, 0] before its parent"),
    "a topk the heads do not output": (_medusa(lambda h: h.update(topk=20)),
                                       "medusa.onnx: its output ids is [batch, query, 3, 10]"),
}


@pytest.mark.parametrize("case", BAD_MEDUSA)
def test_a_bad_medusa_tree_is_refused_in_one_line(tmp_path, case):
    bundle = _copy(demo.bundle_path(), tmp_path)
    change, message = BAD_MEDUSA[case]
    _change(bundle, change)
    _refused_in_one_line(bundle, message, "medusa")


def test_an_id_past_the_embedding_fails_in_one_line_naming_the_graph(llama_bundle, tmp_path):
    """The tokenizer adds tokens past the model's 336 rows (tokenizers numbers them on from its 320): nothing in the
    manifest says so, and ONNX Runtime's failure in the first pass is one line naming the graph."""
    bundle = _copy(llama_bundle, tmp_path)
    tok = json.loads((bundle / "tokenizer.json").read_text())
    tok["added_tokens"] += [{"id": 320 + i, "content": f"<p{i}>", "single_word": False, "lstrip": False,
                             "rstrip": False, "normalized": False, "special": True} for i in range(20)]
    _replace(bundle / "tokenizer.json", json.dumps(tok))
    gen = specrt.load(bundle, threads=1)
    assert gen.encode("<p19>")[-1] == 339
    with pytest.raises(BundleError, match=r"^ONNX Runtime could not run target.onnx: .*out of data bounds") as e:
        gen.generate("<p19>", max_new_tokens=2, method="none")
    assert "\n" not in str(e.value)
    res = CliRunner().invoke(main, ["run", "<p19>", "--bundle", str(bundle), "--max-new-tokens", "2"])
    assert res.exit_code == 1 and "Traceback" not in res.output and "Error: ONNX Runtime could not run" in res.output


def test_valid_manifests_still_load_unchanged(llama_bundle, tmp_path):
    """Old optional fields absent, nulls where they are optional: what export wrote before keeps loading."""
    bundle = _copy(llama_bundle, tmp_path)
    before = specrt.load(bundle, threads=1).generate("x", max_new_tokens=4, method="draft", gamma=2).token_ids
    _change(bundle, lambda m: ([e.pop(k) for e in m["models"].values() for k in (
        "graph", "kind", "eagle_taps", "tap_width", "vocab_map", "variants", "weight_bytes", "golden")],
        m["tokenizer"].pop("chat_template"), m["tokenizer"].pop("special_tokens"), m.pop("vocab_check"),
        m["models"]["target"].update(parity_tolerance=0.05, parity={"prefill": 1e-6})))
    manifest = load_manifest(bundle)
    assert manifest.target.graph == "portable" and manifest.target.parity_tolerance == {"abs": 0.05}
    assert specrt.load(bundle, threads=1).generate("x", max_new_tokens=4, method="draft", gamma=2).token_ids == before


def test_medusa_entries_made_by_export_are_checked_too():
    with pytest.raises(BundleError, match="before its parent"):
        MedusaEntry(file="m.onnx", source="s", num_heads=2, topk=2, tree=[[0, 1]], expected_accepted=1.0,
                    accuracies=[[0.5, 0.1], [0.4, 0.1]])
