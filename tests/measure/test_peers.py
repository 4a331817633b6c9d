"""Peers of `specrt bench --compare`: ONNX Runtime GenAI built by its own builder from the tiny llama the
bundle was exported from (fp32), Hugging Face generate; run inside run_bench with the bench's settings."""

import json
import shutil
import sys
from dataclasses import replace

import pytest
from click.testing import CliRunner

import specrt
from specrt.cli import main
from specrt.data import prompts as builtin_prompts
from specrt.errors import ConfigError, ModelLoadError, SpecrtError
from specrt.measure.bench import BenchConfig, make_peers, run_bench
from specrt.measure.peers import PeerRun, parse_kinds, until_end
from specrt.measure.peers.ortgenai import (
    BuildSpec,
    build_model,
    matching_spec,
    search_options,
)
from specrt.runtime.sampling import SamplingConfig

pytest.importorskip("onnxruntime_genai")


@pytest.fixture(scope="module")
def peer_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("peer-cache")


@pytest.fixture(scope="module")
def gen(llama_bundle):
    return specrt.load(llama_bundle, threads=1)


@pytest.fixture(scope="module")
def ortgenai(gen, peer_cache):
    """The bundle's source target built at fp32 (the bundle's precision) by ONNX Runtime GenAI's builder."""
    (peer,) = make_peers(gen, ["ortgenai"], threads=1, peer_cache=peer_cache)
    return peer


def test_ortgenai_greedy_tokens_equal_specrt_none_on_the_same_fp32_weights(gen, ortgenai):
    assert ortgenai.details["precision"] == "fp32" and ortgenai.details["bundle_precision"] == "fp32"
    assert not ortgenai.details["cached"] and ortgenai.details["build_seconds"] > 0
    prompts = builtin_prompts("all")
    ids = [gen.encode(p) for p in prompts]
    run = ortgenai.generate(ids, 40, SamplingConfig(), seed=0)
    ours = [gen.generate(p, max_new_tokens=40, method="none").token_ids for p in prompts]
    assert run.token_ids == ours
    assert sum(len(t) for t in ours) == 40 * len(prompts)  # no early end: the whole length is compared


def test_bench_carries_peer_rows_and_the_cache_is_reused(gen, ortgenai, peer_cache):
    prompts = builtin_prompts("code")[:3]
    res = run_bench(gen, prompts, BenchConfig(methods=("none", "ngram"), max_new_tokens=10, repeats=2),
                    peers=[ortgenai])
    row = res["peers"]["ortgenai"]
    assert row["greedy_matches_none"] == 1.0 and row["new_tokens"] == 30
    for m in ("none", "ngram"):
        assert row["over_peer"][m] == pytest.approx(res["methods"][m]["tokens_per_second"] / row["tokens_per_second"])
    # The builder's tokenizer adds no BOS for this tokenizer (a TemplateProcessing post-processor adds it in
    # transformers): reported, and the peer decodes from specrt's ids all the same.
    assert row["prompt_ids_equal"] == 0.0
    assert res["config"]["peers"]["sampling"] == {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seeds": [0, 1]}
    json.dumps(res)

    built = {p.name: p.stat().st_mtime_ns for p in peer_cache.iterdir()}
    assert len(built) == 1  # the model, no temporary folder left
    (again,) = make_peers(gen, ["ortgenai"], threads=1, peer_cache=peer_cache)
    assert again.details["cached"] and again.details["model_dir"] == ortgenai.details["model_dir"]
    assert again.details["build_seconds"] == ortgenai.details["build_seconds"]
    assert {p.name: p.stat().st_mtime_ns for p in peer_cache.iterdir()} == built


def test_run_bench_interleaves_peers_with_the_bench_settings(gen):
    class Recorder:
        name, description, details = "rec", "records its calls", {}

        def __init__(self):
            self.calls = []

        def encode(self, prompt):
            return gen.encode(prompt)

        def generate(self, prompt_ids, max_new_tokens, sampling, seed):
            self.calls.append((len(prompt_ids), max_new_tokens, sampling, seed))
            return PeerRun([[5] * max_new_tokens for _ in prompt_ids], 0.01)

    rec, log = Recorder(), []
    cfg = BenchConfig(methods=("none",), max_new_tokens=5, repeats=2, temperature=0.7, top_k=3, top_p=0.9, seed=10)
    res = run_bench(gen, builtin_prompts("code")[:2], cfg, on_progress=log.append, peers=[rec])
    s = SamplingConfig(0.7, 3, 0.9)
    assert rec.calls == [(1, 8, s, 10), (2, 5, s, 10), (2, 5, s, 11)]  # warm-up, then seed + repeat as specrt
    # By default each prompt runs every method (the greedy baseline right after none); the peer runs after them.
    assert log == ["repeat 1/2 · prompt 1/2, every method", "repeat 1/2 · prompt 2/2, every method", "repeat 1/2 · rec",
                   "repeat 2/2 · prompt 1/2, every method", "repeat 2/2 · prompt 2/2, every method", "repeat 2/2 · rec"]
    assert res["config"]["order"] == "interleaved"
    log.clear()  # in blocks, the greedy baseline runs beside none: before it, then after it
    blocks = replace(cfg, interleave=False)
    run_bench(gen, builtin_prompts("code")[:2], blocks, on_progress=log.append, peers=[Recorder()])
    greedy = "none, greedy (the baseline)"
    assert log == [f"repeat 1/2 · {greedy}", "repeat 1/2 · none", "repeat 1/2 · rec",
                   "repeat 2/2 · none", f"repeat 2/2 · {greedy}", "repeat 2/2 · rec"]
    log.clear()  # beside none wherever none comes in the methods
    run_bench(gen, builtin_prompts("code")[:1], BenchConfig(methods=("ngram", "none"), max_new_tokens=3, repeats=2,
                                                            temperature=0.7, interleave=False), on_progress=log.append)
    assert log == ["repeat 1/2 · ngram", f"repeat 1/2 · {greedy}", "repeat 1/2 · none",  # repeat 2 rotated:
                   "repeat 2/2 · none", f"repeat 2/2 · {greedy}", "repeat 2/2 · ngram"]
    row = res["peers"]["rec"]
    assert row["tokens_per_second"] == pytest.approx(1000) and "greedy_matches_none" not in row
    assert row["prompt_ids_equal"] == 1.0
    assert res["config"]["peers"]["sampling"] == {"temperature": 0.7, "top_k": 3, "top_p": 0.9, "seeds": [10, 11]}


def test_ortgenai_follows_the_sampling_settings(gen, ortgenai):
    assert search_options(SamplingConfig(), 3, 20) == {"max_length": 20, "min_length": 0, "num_beams": 1,
                                                       "repetition_penalty": 1.0, "do_sample": False}
    assert search_options(SamplingConfig(0.8, 0, 0.9), 3, 20) == {
        "max_length": 20, "min_length": 0, "num_beams": 1, "repetition_penalty": 1.0, "do_sample": True,
        "temperature": 0.8, "top_k": 0, "top_p": 0.9, "random_seed": 3}
    ids = [gen.encode("def fib(n):")]
    hot = SamplingConfig(1.0)
    first = ortgenai.generate(ids, 12, hot, seed=1).token_ids
    assert ortgenai.generate(ids, 12, hot, seed=1).token_ids == first
    assert ortgenai.generate(ids, 12, hot, seed=2).token_ids != first

    def first_tokens(top_k: int) -> set[tuple[int, ...]]:  # near-uniform rows: the first token of 120 seeded
        s = SamplingConfig(50.0, top_k)                      # runs (() where it was the end id)
        return {tuple(ortgenai.generate(ids, 1, s, seed=k).token_ids[0]) for k in range(120)}

    assert len(first_tokens(0)) > 50  # top_k 0 is off, not GenAI's default of 50
    assert len(first_tokens(4)) <= 4


def test_hf_peer_follows_the_sampling_settings(gen):
    from specrt.measure.peers.hf import sampling_kwargs

    assert sampling_kwargs(SamplingConfig()) == {"do_sample": False, "repetition_penalty": 1.0}
    assert sampling_kwargs(SamplingConfig(0.8, 0, 0.9)) == {"do_sample": True, "temperature": 0.8, "top_k": 0,
                                                           "top_p": 0.9, "repetition_penalty": 1.0}
    (hf,) = make_peers(gen, ["hf"], threads=1)  # the tiny pair's heads differ: no assisted generation
    assert "no assisted generation: the heads have 336 and 352 ids" in hf.description
    ids = [gen.encode("def fib(n):")]
    greedy = hf.generate(ids, 16, SamplingConfig(), seed=0).token_ids
    assert greedy == [gen.generate("def fib(n):", max_new_tokens=16, method="none").token_ids]
    hot = SamplingConfig(1.0, 20, 0.95)
    first = hf.generate(ids, 16, hot, seed=1).token_ids
    assert hf.generate(ids, 16, hot, seed=1).token_ids == first and first != greedy
    assert hf.generate(ids, 16, hot, seed=2).token_ids != first


def test_precision_matches_the_bundle(gen):
    target = gen.manifest.target
    assert matching_spec(target) == BuildSpec("fp32")
    spec = matching_spec(replace(target, dtype="float16"))
    assert spec.precision == "fp32" and "no fp16 for CPU" in spec.note
    int4 = replace(target, quantization={"bits": 4, "block_size": 64, "accuracy_level": 4})
    assert matching_spec(int4).extra_options() == ["block_size=64", "accuracy_level=4"] and not matching_spec(int4).note
    assert matching_spec(replace(target, quantization={"bits": 8, "block_size": 32, "accuracy_level": 4})).precision == "int8"
    spec = matching_spec(int4, "fp32")
    assert spec.precision == "fp32" and spec.extra_options() == [] and "--peer-precision fp32" in spec.note
    with pytest.raises(ConfigError, match="fp32, int8, int4"):
        BuildSpec("fp16")


def test_failed_or_interrupted_builds_leave_no_cache(pairs, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(pairs["llama"][0], broken)
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps(config | {"architectures": ["NoSuchForCausalLM"]}))
    cache = tmp_path / "cache"
    with pytest.raises(ModelLoadError, match="model builder failed"):
        build_model(broken, BuildSpec("fp32"), cache)
    assert list(cache.iterdir()) == []

    def interrupt(line):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_model(pairs["llama"][0], BuildSpec("fp32"), cache, on_progress=interrupt)
    assert list(cache.iterdir()) == []
    with pytest.raises(ModelLoadError, match="does not exist .pass --hf-target"):
        build_model(tmp_path / "gone", BuildSpec("fp32"), cache)


def test_compare_cli(llama_bundle, peer_cache, ortgenai, tmp_path):
    out = tmp_path / "bench.json"
    args = ["bench", "--bundle", str(llama_bundle), "--methods", "none", "--max-new-tokens", "6", "--repeats", "1",
            "--prompt-set", "prose", "--threads", "1", "--peer-cache", str(peer_cache)]
    res = CliRunner().invoke(main, args + ["--compare", "ortgenai", "--compare", "hf,ortgenai", "--json", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert list(data["peers"]) == ["ortgenai", "hf_generate"]
    assert all(row["greedy_matches_none"] == 1.0 for row in data["peers"].values())
    assert "peers ran greedy, from specrt's prompt ids" in res.output and "none/peer" in res.output
    assert "from the cache" in res.output and "end-of-sequence" in res.output

    res = CliRunner().invoke(main, args + ["--compare", "ortgenai", "--temperature", "0.8", "--top-k", "20",
                                           "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "peers ran T 0.8 top-k 20, seed 0" in res.output
    assert "greedy_matches_none" not in json.loads(out.read_text())["peers"]["ortgenai"]


def test_compare_cli_errors(llama_bundle, tmp_path, monkeypatch):
    base = ["bench", "--bundle", str(llama_bundle), "--methods", "none", "--max-new-tokens", "4", "--repeats", "1"]
    res = CliRunner().invoke(main, base + ["--compare", "hf,foo"])
    assert res.exit_code == 1 and "unknown peer 'foo'" in res.output and "hf, llamacpp, ortgenai" in res.output
    res = CliRunner().invoke(main, base + ["--compare", "ortgenai", "--peer-precision", "fp16"])
    assert res.exit_code == 2 and "'fp16' is not one of" in res.output
    res = CliRunner().invoke(main, base + ["--compare", "hf", "--peer-precision", "int4"])
    assert res.exit_code == 1 and "--peer-precision applies to --compare ortgenai" in res.output

    moved = tmp_path / "bundle"
    shutil.copytree(llama_bundle, moved)
    manifest = json.loads((moved / "specrt.json").read_text())
    manifest["models"]["target"]["source"] = str(tmp_path / "deleted-checkpoint")
    (moved / "specrt.json").write_text(json.dumps(manifest))
    res = CliRunner().invoke(main, ["bench", "--bundle", str(moved), "--methods", "none", "--max-new-tokens", "4",
                                    "--repeats", "1", "--compare", "ortgenai", "--peer-cache", str(tmp_path / "c")])
    assert res.exit_code == 1 and "deleted-checkpoint does not exist (pass --hf-target)" in res.output
    assert len(res.output.strip().splitlines()) == 1

    monkeypatch.setitem(sys.modules, "onnxruntime_genai", None)  # as if the [peers] extra were not installed
    with pytest.raises(SpecrtError, match=r"pip install 'specrt\[peers\]'"):
        make_peers(specrt.load(llama_bundle), ["ortgenai"], peer_cache=tmp_path / "c")
    res = CliRunner().invoke(main, base + ["--compare", "ortgenai", "--peer-cache", str(tmp_path / "c")])
    assert res.exit_code == 1 and "pip install 'specrt[peers]'" in res.output


def test_parse_kinds_and_until_end():
    assert parse_kinds(["ortgenai", "hf,ortgenai", ""]) == ("ortgenai", "hf")
    with pytest.raises(ConfigError, match="unknown peer 'foo'"):
        parse_kinds(["foo"])
    assert until_end([5, 6, 1, 7], {1}) == [5, 6] and until_end([5, 6], {1}) == [5, 6]


def test_with_chat_the_peer_tokenizes_the_rendered_conversation(chat_bundle):
    """--chat: specrt decodes from the template's ids; the peer is asked to tokenize the rendered text (what
    its own chat path would see), not the bare message, so equal tokenizers report equal ids."""
    chat = specrt.load(chat_bundle, threads=1)

    class Echo:
        name, description, details = "echo", "tokenizes like specrt", {}

        def encode(self, text):
            return chat.tokenizer.encode(text, add_special_tokens=False).ids

        def generate(self, prompt_ids, max_new_tokens, sampling, seed):
            return PeerRun([[5] * max_new_tokens for _ in prompt_ids], 0.01)

    res = run_bench(chat, ["Hi there", "Name a colour."], BenchConfig(methods=("none",), max_new_tokens=3,
                                                                       repeats=1, chat=True), peers=[Echo()])
    assert res["peers"]["echo"]["prompt_ids_equal"] == 1.0


def test_genai_gets_as_many_threads_as_specrt(tmp_path, monkeypatch):
    """Without --threads GenAI's own default ran like one thread beside specrt's two: each peer is given the
    thread count specrt's sessions use (--threads, or every core), and says so in its details."""
    import os
    import types

    from specrt.measure.peers import ortgenai as og_peer

    overlays = []

    class Config:
        def __init__(self, path):
            self.path = path

        def overlay(self, text):
            overlays.append(json.loads(text))

    stand_in = types.SimpleNamespace(Config=Config, Model=lambda config: config, Tokenizer=lambda model: None,
                                     __version__="stand-in")
    monkeypatch.setattr(og_peer, "_og", lambda: stand_in)
    (tmp_path / "genai_config.json").write_text(json.dumps({"model": {"eos_token_id": 2}}))
    threads = lambda o: o["model"]["decoder"]["session_options"]["intra_op_num_threads"]  # noqa: E731
    assert og_peer.OrtGenaiPeer(tmp_path).details["threads"] == os.cpu_count() == threads(overlays[-1])
    assert og_peer.OrtGenaiPeer(tmp_path, threads=1).details["threads"] == 1 == threads(overlays[-1])
