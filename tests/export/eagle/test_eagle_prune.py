"""`specrt eagle prune`: a head's N most frequent draft ids kept (FR-Spec), the rest of its LM head dropped.

The kept rows are the trained ones, so the smaller head drafts from its own distribution over them and
stays exact; the counts come from the head's record (`eagle train` writes it) or from text.
"""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file
from support.models import make_tokenizer, save_eagle_head, save_model
from transformers import AutoConfig

from specrt.cli import main
from specrt.export.eagle.checkpoint import load_eagle3
from specrt.export.eagle.prune import COUNTS_NAME, pruned_head, read_counts, write_counts
from specrt.export.eagle.vocab import ranked_ids

LAYERS, DRAFT = 5, 96
TEXT = "def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(add(i, i))\n" * 3


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """A tiny llama target, its end id, and a head whose draft ids are listed out of order."""
    root = tmp_path_factory.mktemp("prune")
    tok = make_tokenizer()
    target = save_model(root / "target", "llama", seed=1, layers=LAYERS, hidden=64, tokenizer=tok)
    head = save_eagle_head(root / "head", target, seed=3, draft_vocab=DRAFT, ascending=False)
    return {"target": target, "head": head, "eos": tok.eos_token_id, "tok": tok}


def _targets(folder, target) -> torch.Tensor:
    cfg, _, d2t, _ = load_eagle3(folder, AutoConfig.from_pretrained(target))
    return torch.arange(cfg.draft_vocab_size) + d2t


def _prune(*args: str):
    return CliRunner().invoke(main, ["eagle", "prune", *args])


def test_ranked_ids_keep_the_end_ids_then_the_most_frequent_ties_to_the_lower_id():
    counts = torch.tensor([5, 0, 9, 5, 1, 7])
    always = torch.tensor([False, True, False, False, False, False])
    assert ranked_ids(counts, 4, always).tolist() == [0, 1, 2, 5]  # 1 (an end id), 2 (9), 5 (7), 0 (5 before 3)
    assert ranked_ids(counts, 1, always).tolist() == [1]


def test_a_pruned_head_is_the_old_one_restricted_to_the_kept_ids(sources):
    cfg, head, d2t, _ = load_eagle3(sources["head"], AutoConfig.from_pretrained(sources["target"]))
    keep = torch.tensor([3, 10, 11, 50, 95])
    small, new_d2t, new_t2d = pruned_head(head, d2t, keep)
    assert small.cfg.draft_vocab_size == 5
    old, new = head.state_dict(), small.state_dict()
    assert set(old) == set(new)
    for name in old:
        want = old[name][keep] if name == "lm_head.weight" else old[name]
        assert torch.equal(new[name], want), name
    targets = keep + d2t[keep]
    assert (torch.arange(5) + new_d2t).tolist() == targets.tolist()  # each kept id drafts its old target id
    assert new_t2d.nonzero().flatten().tolist() == sorted(targets.tolist())
    h = torch.randn(2, 3, cfg.hidden_size)  # so the logits are the old ones at the kept ids
    assert torch.allclose(small.lm_head(h), head.lm_head(h)[..., keep])


def test_recorded_counts_rank_the_ids_and_the_end_ids_stay(sources, tmp_path):
    head = tmp_path / "head"
    head.mkdir()
    for f in sources["head"].iterdir():
        (head / f.name).write_bytes(f.read_bytes())
    targets = _targets(head, sources["target"])
    counts = torch.arange(DRAFT) % 17  # the end id (if a draft id) counted rarely
    write_counts(head, counts, [sources["eos"]], "a test")
    out = tmp_path / "small"
    res = _prune(str(sources["target"]), str(head), "-o", str(out), "--draft-vocab", "20")
    assert res.exit_code == 0, res.output
    assert f"wrote {out}: 20 of {DRAFT} draft ids" in res.output and "counted in a test" in res.output
    assert f"specrt export {sources['target']} --eagle {out}" in res.output

    kept = _targets(out, sources["target"])
    assert len(kept) == 20
    ends = [int(i) for i in range(DRAFT) if int(targets[i]) == sources["eos"]]
    expect = ranked_ids(counts, 20, torch.isin(targets, torch.tensor([sources["eos"]])))
    assert sorted(kept.tolist()) == sorted(targets[expect].tolist())
    assert all(int(targets[i]) in kept.tolist() for i in ends)
    left_out = [i for i in range(DRAFT) if int(targets[i]) not in kept.tolist()]
    kept_draft = [i for i in range(DRAFT) if int(targets[i]) in kept.tolist() and i not in ends]
    assert min(int(counts[i]) for i in kept_draft) >= max(int(counts[i]) for i in left_out)
    record = read_counts(out, 20)  # the counts travel with the head, so it prunes again
    assert record["counts"].tolist() == counts[expect].tolist() and record["pruned_from"] == str(head)
    assert record["coverage_after"] < record["coverage_before"] == 1.0
    assert load_file(str(out / "model.safetensors"))["lm_head.weight"].shape == (20, 64)
    again = _prune(str(sources["target"]), str(out), "-o", str(out / "smaller"), "--draft-vocab", "10")
    assert again.exit_code == 0, again.output  # the record it keeps prunes it again
    smaller = _targets(out / "smaller", sources["target"]).tolist()
    assert len(smaller) == 10 and set(smaller) <= set(kept.tolist())
    assert _prune(str(sources["target"]), str(head), "-o", str(out / "smaller"), "--draft-vocab", "12").exit_code \
        == 0 and len(_targets(out / "smaller", sources["target"])) == 12  # a rerun into its own folder


def test_text_counts_rank_the_ids_by_the_targets_tokenizer(sources, tmp_path):
    text = tmp_path / "replies.txt"
    text.write_text(TEXT)
    out = tmp_path / "small"
    res = _prune(str(sources["target"]), str(sources["head"]), "-o", str(out), "--draft-vocab", "12",
                 "--text", str(text))
    assert res.exit_code == 0, res.output
    targets = _targets(sources["head"], sources["target"]).tolist()
    kept = set(_targets(out, sources["target"]).tolist())
    vocab = AutoConfig.from_pretrained(sources["target"]).vocab_size
    freq = torch.bincount(torch.tensor(sources["tok"](TEXT, add_special_tokens=False).input_ids), minlength=vocab)
    ranked = [t for t in targets if t != sources["eos"]]
    assert min(int(freq[t]) for t in kept if t != sources["eos"]) >= max(int(freq[t]) for t in ranked
                                                                           if t not in kept)
    assert int(freq[sorted(kept)].sum()) > 0
    assert json.loads((out / COUNTS_NAME).read_text())["from"] == f"text: {text}"


@pytest.mark.parametrize("case", ["no counts", "same folder", "too many", "no text", "foreign files"])
def test_refusals_are_one_line_errors_and_write_nothing(sources, tmp_path, case):
    out = tmp_path / "out"
    args = [str(sources["target"]), str(sources["head"]), "-o", str(out), "--draft-vocab", "10"]
    if case == "same folder":
        args[3] = str(sources["head"])
    elif case == "too many":
        args[-1] = str(DRAFT)
    elif case == "foreign files":  # e.g. another head's record: pruning into it would mix the two
        args += ["--text", str(tmp_path / "t.txt")]
        (tmp_path / "t.txt").write_text(TEXT)
        out.mkdir()
        (out / "training.json").write_text("{}")
    elif case == "no text":
        (tmp_path / "blank.txt").write_text("  \n")
        args += ["--text", str(tmp_path / "blank.txt")]
    before = sorted(p.name for p in sources["head"].iterdir())
    res = _prune(*args)
    assert res.exit_code != 0 and res.output.startswith("Error: ") and "Traceback" not in res.output
    assert {"no counts": "records no token counts", "same folder": "must be a new folder",
            "too many": "between 1 and 95", "no text": "no text in", "foreign files": "holds training.json"}[case] \
        in res.output
    assert sorted(p.name for p in sources["head"].iterdir()) == before
    assert [p.name for p in out.iterdir()] == ["training.json"] if case == "foreign files" else not out.exists()


def test_a_pruned_head_exports_and_drafts_exactly(sources, tmp_path):
    """The smaller head is a head like any other: exported with the target (parity checked against PyTorch), its
    greedy chains and trees give the target's own tokens, and sampling with it stays seeded and runs."""
    from specrt import load
    from specrt.export.exporter import export_bundle

    text = tmp_path / "replies.txt"
    text.write_text(TEXT)
    small = tmp_path / "small"
    assert _prune(str(sources["target"]), str(sources["head"]), "-o", str(small), "--draft-vocab", "24",
                  "--text", str(text)).exit_code == 0
    export_bundle(str(sources["target"]), None, tmp_path / "bundle", eagle=str(small))
    gen = load(tmp_path / "bundle")
    assert gen.manifest.eagle.dims.vocab_size == 24
    prompt = "def add(a, b):\n    "
    plain = gen.generate(prompt, method="none", max_new_tokens=24).token_ids
    assert gen.generate(prompt, method="eagle", max_new_tokens=24, gamma=3).token_ids == plain
    assert gen.generate(prompt, method="eagle-tree", max_new_tokens=24).token_ids == plain
    sampled = [gen.generate(prompt, method="eagle", max_new_tokens=16, temperature=0.8, seed=5).token_ids
               for _ in range(2)]
    assert sampled[0] == sampled[1] and len(sampled[0]) == 16


@pytest.mark.parametrize("variant", [{"norm_before_fc": True}, {"norm_output": True}])
def test_a_speculators_head_prunes_with_its_variants(tmp_path, variant):
    """A published speculators-format head: its variants survive (written in EAGLE's flat layout where that can
    describe them, a tap norm; else in the speculators format, a fed-back normalised state)."""
    from support.eagle_heads import random_head, speculators_config, write_speculators

    from specrt.export.eagle.checkpoint import read_config

    tok = make_tokenizer()
    target = save_model(tmp_path / "target", "llama", seed=1, layers=LAYERS, hidden=48, tokenizer=tok)
    raw = speculators_config(vocab=AutoConfig.from_pretrained(target).vocab_size, draft=64, hidden=48, **variant)
    cfg = read_config(raw)
    head = write_speculators(tmp_path / "head", raw, random_head(cfg))
    (tmp_path / "t.txt").write_text(TEXT)
    res = _prune(str(target), str(head), "-o", str(tmp_path / "out"), "--draft-vocab", "16", "--text",
                 str(tmp_path / "t.txt"))
    assert res.exit_code == 0, res.output
    small = load_eagle3(tmp_path / "out", AutoConfig.from_pretrained(target))[0]
    assert small.draft_vocab_size == 16 and (small.tap_norm, small.feed_normed) == (cfg.tap_norm, cfg.feed_normed)
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert ("speculators_model_type" in written) == cfg.feed_normed
