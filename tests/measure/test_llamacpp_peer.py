"""`specrt bench --compare llamacpp`: llama.cpp (llama-cpp-python) on a tiny GGUF written as llama.cpp lays
it out, against specrt's bundle exported from the same file. F32 weights, so both compute the same numbers
up to float rounding and greedy tokens must agree; quantized blocks would add llama.cpp's int8 activations."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from support.gguf import write_llama_gguf
from support.models import CHAT_TEMPLATE, make_tokenizer

import specrt
from specrt.cli import main
from specrt.data import prompts as builtin_prompts
from specrt.errors import ConfigError, ModelLoadError
from specrt.measure.bench import BenchConfig, make_peers, run_bench
from specrt.measure.peers.llamacpp import LlamaCppPeer, sampling_kwargs
from specrt.runtime.sampling import SamplingConfig

# Every test here runs llama.cpp itself; CI installs it (the `llamacpp` extra), a dev venv may not.
pytest.importorskip("llama_cpp", reason="llama-cpp-python is the llamacpp extra: pip install -e '.[llamacpp]'")


@pytest.fixture(scope="module")
def f32_gguf(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    root = tmp_path_factory.mktemp("lcp")
    tok = make_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=256, bos_token_id=0, eos_token_id=1,
                                         tie_word_embeddings=True)).eval()
    model.save_pretrained(root / "hf")
    tok.save_pretrained(root / "hf")
    return write_llama_gguf(root / "hf", root / "tiny-f32.gguf", linear="F32", embedding="F32",
                            chat_template=CHAT_TEMPLATE)


@pytest.fixture(scope="module")
def gguf_bundle(f32_gguf, tmp_path_factory):
    from specrt.export.exporter import ExportOptions
    from specrt.export.pipeline import export_pipeline

    out = tmp_path_factory.mktemp("lcp-bundle") / "b"
    export_pipeline(str(f32_gguf), None, out, ExportOptions())
    return out


@pytest.fixture(scope="module")
def gen(gguf_bundle):
    return specrt.load(gguf_bundle, threads=1)


@pytest.fixture(scope="module")
def peers(gen):
    return make_peers(gen, ["llamacpp"], threads=1)


def test_the_kind_gives_plain_and_prompt_lookup_on_the_bundles_own_gguf(peers, f32_gguf):
    plain, lookup = peers
    assert (plain.name, lookup.name) == ("llamacpp", "llamacpp-lookup")
    assert plain.details["gguf"] == str(f32_gguf.resolve()) and plain.details["threads"] == 1
    assert plain.details["lookup_tokens"] is None and lookup.details["lookup_tokens"] == 2
    assert "F32" in plain.details["model"] or "all F32" in plain.details["model"]


def test_greedy_tokens_equal_specrt_none_on_the_same_f32_gguf(gen, peers):
    prompts = builtin_prompts("all")
    ids = [gen.encode(p) for p in prompts]
    ours = [gen.generate(p, max_new_tokens=24, method="none").token_ids for p in prompts]
    assert sum(len(t) for t in ours) == 24 * len(prompts)  # no early end: the whole length is compared
    # llama.cpp reads the GGUF's tokenizer itself; its "default" pre-tokenizer splits text unlike this test
    # BPE's byte-level one (SmolLM2's gives specrt's ids for every bench prompt), so peers decode specrt's ids
    # and the bench reports how often the peer's own tokenizer agrees.
    assert peers[0].encode("x = 1")[0] == 0  # BOS first: the GGUF says add_bos_token
    for peer in peers:  # prompt lookup is exact under greedy decoding too
        assert peer.generate(ids, 24, SamplingConfig(), seed=0).token_ids == ours, peer.name


def test_each_call_prefills_from_an_empty_cache(gen, peers):
    """llama-cpp-python reuses a previous call's prefix unless reset: a repeat would then skip the prefill
    and time less work than specrt's."""
    plain = peers[0]
    ids = [gen.encode("def add(a, b):")]
    first = plain.generate(ids, 8, SamplingConfig(), seed=0)
    assert plain._llm.n_tokens == len(ids[0]) + 7  # the last token is sampled, not fed
    again = plain.generate(ids, 8, SamplingConfig(), seed=0)
    assert again.token_ids == first.token_ids and again.seconds > 0


def test_sampling_follows_the_seed_with_every_default_filter_off(gen, peers):
    s = SamplingConfig(temperature=1.0)
    kwargs = sampling_kwargs(s)
    assert kwargs["min_p"] == 0.0 and kwargs["top_k"] == 0 and kwargs["top_p"] == 1.0 and kwargs["temp"] == 1.0
    assert kwargs["repeat_penalty"] == 1.0 and sampling_kwargs(SamplingConfig())["temp"] == 0.0
    ids = [gen.encode(p) for p in builtin_prompts("code")[:2]]
    a = peers[0].generate(ids, 16, s, seed=1).token_ids
    assert a == peers[0].generate(ids, 16, s, seed=1).token_ids
    assert a != peers[0].generate(ids, 16, s, seed=2).token_ids
    assert all(0 <= t < gen.manifest.target.dims.vocab_size for row in a for t in row)


def test_a_longer_request_gets_a_longer_context(gen):
    peer = LlamaCppPeer(gen.manifest.target.source, "llamacpp", threads=1)
    assert peer._ctx == 512
    ids = [gen.encode("x = 1")]
    run = peer.generate(ids, 600, SamplingConfig(), seed=0)
    assert peer._ctx == 1024 and len(run.token_ids[0]) <= 600


def test_bench_reports_llamacpp_rows_beside_specrts_methods(gen, peers):
    res = run_bench(gen, builtin_prompts("code")[:2], BenchConfig(methods=("none", "ngram"), max_new_tokens=8,
                                                                  repeats=1), peers=peers)
    for name in ("llamacpp", "llamacpp-lookup"):
        row = res["peers"][name]
        assert row["tokens_per_second"] > 0 and 0 <= row["prompt_ids_equal"] <= 1
        assert row["greedy_matches_none"] == 1.0 and row["greedy_common_prefix"] == 1.0
        assert set(row["over_peer"]) == {"none", "ngram"}


def test_the_cli_compares_and_writes_the_rows(gguf_bundle, tmp_path):
    out = tmp_path / "b.json"
    r = CliRunner().invoke(main, ["bench", "--bundle", str(gguf_bundle), "--methods", "none", "--compare", "llamacpp",
                                  "--max-new-tokens", "6", "--repeats", "1", "--threads", "1", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert set(json.loads(out.read_text())["peers"]) == {"llamacpp", "llamacpp-lookup"}
    assert "llama.cpp via llama-cpp-python" in r.output


def test_without_a_gguf_or_with_a_broken_one_it_is_one_line(llama_bundle, f32_gguf, tmp_path):
    runner = CliRunner()
    base = ["bench", "--bundle", str(llama_bundle), "--methods", "none", "--compare", "llamacpp", "--repeats", "1"]
    r = runner.invoke(main, base)
    assert r.exit_code != 0 and "--peer-gguf" in r.output and "Traceback" not in r.output
    r = runner.invoke(main, base + ["--peer-gguf", str(tmp_path / "missing.gguf")])
    assert r.exit_code != 0 and "does not exist" in r.output and "Traceback" not in r.output
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(f32_gguf.read_bytes()[:5000])
    with pytest.raises(ModelLoadError, match="llama.cpp cannot load"):
        LlamaCppPeer(broken, "llamacpp", threads=1)
    gen = specrt.load(llama_bundle, threads=1)
    with pytest.raises(ConfigError, match="needs a GGUF"):
        make_peers(gen, ["llamacpp"])


def test_one_run_compares_llamacpp_and_ortgenai_on_a_gguf_bundle(gguf_bundle, f32_gguf, tmp_path):
    """ONNX Runtime GenAI's builder reads Hugging Face folders: the GGUF is read into one (a child process,
    cached beside its builds), so `--compare llamacpp,ortgenai` needs nothing but the GGUF bundle."""
    pytest.importorskip("onnxruntime_genai")
    from specrt.measure.peers.ortgenai import hf_folder

    out = tmp_path / "b.json"
    args = ["bench", "--bundle", str(gguf_bundle), "--methods", "none", "--compare", "llamacpp,ortgenai",
            "--peer-cache", str(tmp_path / "cache"), "--max-new-tokens", "12", "--repeats", "1", "--threads", "1",
            "--json", str(out)]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    rows = json.loads(out.read_text())["peers"]
    assert set(rows) == {"llamacpp", "llamacpp-lookup", "ortgenai"}
    assert rows["ortgenai"]["precision"] == "fp32" and rows["ortgenai"]["greedy_matches_none"] == 1.0
    assert rows["llamacpp"]["greedy_matches_none"] == 1.0
    staged = hf_folder(f32_gguf, tmp_path / "cache")  # the second time: the folder is reused as it is
    assert (staged / "config.json").is_file() and staged.parent == tmp_path / "cache"
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(f32_gguf.read_bytes()[:5000])
    with pytest.raises(ModelLoadError, match="needs a Hugging Face folder; reading .* failed: could not read"):
        hf_folder(broken, tmp_path / "cache")
