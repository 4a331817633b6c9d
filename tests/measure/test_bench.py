import dataclasses
import json
import types

import pytest
from click.testing import CliRunner

from specrt.cli import main
from specrt.data import prompts as builtin_prompts
from specrt.errors import ConfigError
from specrt.measure.bench import BenchConfig, read_prompts, run_bench
from specrt.theory import speedup


def test_bench_figures_are_well_formed(generator):
    prompts = builtin_prompts("code")[:2]
    res = run_bench(generator, prompts, BenchConfig(methods=("none", "draft", "tree", "ngram"), max_new_tokens=12, repeats=2))
    assert set(res["methods"]) == {"none", "draft", "tree", "ngram"}
    none, draft = res["methods"]["none"], res["methods"]["draft"]
    assert none["speedup_vs_none"] == 1.0 and none["tokens_per_target_pass"] == 1.0
    assert draft["speedup_vs_none"] == pytest.approx(draft["tokens_per_second"] / none["tokens_per_second"])
    assert all(r["greedy_matches_none"] for r in res["methods"].values())
    assert "greedy_baseline" not in res and "vs_greedy_none" not in none  # greedy runs are their own baseline
    assert 0 <= draft["alpha"] <= 1 and draft["c"] > 0 and draft["verify_cost"] > 0
    assert none["verify_cost"] == 1.0 and none["predicted_speedup"] is None
    assert draft["predicted_speedup"] == pytest.approx(
        speedup(min(draft["alpha"], 1.0), round(draft["mean_gamma"]), draft["c"]))
    assert draft["achieved_over_predicted"] == pytest.approx(draft["speedup_vs_none"] / draft["predicted_speedup"])
    shares = sum(draft[k] for k in ("share_draft", "share_verify", "share_prefill", "share_host"))
    assert shares == pytest.approx(1.0, abs=1e-6)
    json.dumps(res)


def test_the_bench_table_shows_device_to_host_bytes_where_outputs_left_a_gpu(generator, capsys):
    from specrt.measure.report import print_bench

    res = run_bench(generator, builtin_prompts("code")[:1], BenchConfig(methods=("none", "draft"), max_new_tokens=6))
    print_bench(res)
    assert "D2H/pass" not in capsys.readouterr().out  # a CPU backend copies nothing
    res["methods"]["none"]["d2h_bytes_per_target_pass"] = 516.0
    print_bench(res)
    out = capsys.readouterr().out
    assert "D2H/pass" in out and "0.5 KB" in out


def test_bench_runs_chains_of_several_lengths_in_one_run(generator):
    res = run_bench(generator, builtin_prompts("code")[:1],
                    BenchConfig(methods=("none", "draft@1", "draft@3", "draft@auto"), max_new_tokens=12, repeats=1))
    rows = res["methods"]
    assert rows["draft@1"]["mean_gamma"] <= 1.0 and 1.0 < rows["draft@3"]["mean_gamma"] <= 3.0
    assert rows["draft@auto"]["predicted_speedup"] is not None
    assert all(r["greedy_matches_none"] for r in rows.values())
    assert BenchConfig(methods=("none",)).options("eagle@auto", 0).gamma == "auto"
    for bad in ("draft@x", "draft@0"):
        with pytest.raises(ConfigError, match="gamma"):
            BenchConfig(methods=("none", bad))


def test_each_repeat_starts_one_method_later(generator, monkeypatch):
    seen = []
    real = generator.stream_ids

    def recording(ids, options=None, **changes):
        seen.append(options.method if options is not None else changes.get("method"))
        return real(ids, options, **changes)

    monkeypatch.setattr(generator, "stream_ids", recording)
    run_bench(generator, builtin_prompts("code")[:1],
              BenchConfig(methods=("none", "ngram", "draft"), max_new_tokens=4, repeats=3))
    assert seen[1:] == ["none", "ngram", "draft", "ngram", "draft", "none", "draft", "none", "ngram"]  # after the warm-up


@pytest.mark.parametrize("interleave", [True, False])
def test_methods_interleave_by_prompt_or_run_in_blocks(generator, monkeypatch, interleave):
    """Interleaved, each prompt runs every method before the next one, the order rotating by prompt, the greedy
    baseline right after sampled none: drift weighs on every method alike. In blocks, one method at a time."""
    seen = []
    real = generator.stream_ids

    def recording(ids, options=None, **changes):
        if options is not None:  # the warm-up passes its settings as keywords
            seen.append((options.method + ("" if options.temperature else " greedy"), ids[-1]))
        return real(ids, options, **changes)

    monkeypatch.setattr(generator, "stream_ids", recording)
    prompts = builtin_prompts("code")[:2]
    last = [generator.encode(p)[-1] for p in prompts]
    res = run_bench(generator, prompts, BenchConfig(methods=("none", "ngram", "draft"), max_new_tokens=4, repeats=2,
                                                   temperature=0.8, interleave=interleave))
    runs = [m for m, _ in seen]
    if interleave:
        assert runs == ["none", "none greedy", "ngram", "draft", "ngram", "draft", "none", "none greedy",
                        "ngram", "draft", "none", "none greedy", "draft", "none", "none greedy", "ngram"]
        assert [i for _, i in seen[:8]] == [last[0]] * 4 + [last[1]] * 4
    else:
        assert runs == ["none greedy"] * 2 + ["none"] * 2 + ["ngram"] * 2 + ["draft"] * 2 + ["ngram"] * 2 + [
            "draft"] * 2 + ["none"] * 2 + ["none greedy"] * 2
    assert res["config"]["order"] == ("interleaved" if interleave else "blocks")
    assert res["greedy_baseline"]["tokens_per_second"] > 0


def test_bench_config_and_prompt_errors(tmp_path):
    with pytest.raises(ConfigError, match="include 'none'"):
        BenchConfig(methods=("draft",))
    with pytest.raises(ConfigError):
        read_prompts(tmp_path / "missing.txt")
    (tmp_path / "p.txt").write_text("def f():\\n    return\n\nclass A:\n")
    assert read_prompts(tmp_path / "p.txt") == ["def f():\n    return", "class A:"]
    assert len(builtin_prompts("all")) == len(builtin_prompts("code")) + len(builtin_prompts("prose"))


def test_bench_cli_writes_json(llama_bundle, tmp_path):
    out = tmp_path / "bench.json"
    res = CliRunner().invoke(main, ["bench", "--bundle", str(llama_bundle), "--methods", "none,ngram",
                                    "--max-new-tokens", "8", "--repeats", "1", "--json", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["config"]["methods"] == ["none", "ngram"] and "ngram" in data["methods"]
    res = CliRunner().invoke(main, ["bench", "--bundle", str(llama_bundle), "--methods", "draft"])
    assert res.exit_code == 1 and "include 'none'" in res.output


def test_bench_compare_hf(close_bundle, tmp_path):
    out = tmp_path / "bench.json"
    res = CliRunner().invoke(main, ["bench", "--bundle", str(close_bundle), "--methods", "none,draft",
                                    "--max-new-tokens", "8", "--repeats", "1", "--prompt-set", "prose",
                                    "--temperature", "0.9", "--top-p", "0.95", "--compare", "hf", "--json", str(out)])
    assert res.exit_code == 0, res.output
    peers = json.loads(out.read_text())["peers"]
    assert peers["hf_generate"]["tokens_per_second"] > 0 and peers["hf_assisted"]["tokens_per_second"] > 0
    assert peers["hf_assisted"]["over_peer"]["draft"] > 0 and "greedy_matches_none" not in peers["hf_assisted"]
    assert "Hugging Face assisted generation" in res.output and "peers ran T 0.9 top-p 0.95, seed 0" in res.output
    res = CliRunner().invoke(main, ["bench", "--bundle", str(close_bundle), "--methods", "none",
                                    "--max-new-tokens", "4", "--repeats", "1", "--compare", "hf",
                                    "--hf-target", str(tmp_path)])
    assert res.exit_code == 1 and "has no config.json" in res.output


def test_bench_samples_with_truncation_and_reports_host_time(close_bundle, tmp_path):
    out = tmp_path / "bench.json"
    res = CliRunner().invoke(main, ["bench", "--bundle", str(close_bundle), "--methods", "none,draft",
                                    "--max-new-tokens", "8", "--repeats", "1", "--temperature", "0.8",
                                    "--top-k", "20", "--top-p", "0.9", "--json", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert (data["config"]["top_k"], data["config"]["top_p"], data["config"]["temperature"]) == (20, 0.9, 0.8)
    greedy = data["greedy_baseline"]  # greedy plain decoding, run beside the sampled none run
    # Host time is reported for both; which is larger is timing (sampling adds little beside the binding
    # work both pay), not something a test can assert.
    assert greedy["tokens_per_second"] > 0 and 0 < greedy["host_ms_per_token"] < 1000 / greedy["tokens_per_second"]
    for row in data["methods"].values():
        assert 0 < row["host_ms_per_token"] < 1000 / row["tokens_per_second"]  # a part of each token's time
        assert 0 < row["share_engine"] < 1 and row["d2h_bytes_per_target_pass"] == 0  # CPU: no copies
        assert "greedy_matches_none" not in row
        # One repeat: its ratio is the repeat's own, not a ratio of the medians of separate runs.
        assert row["vs_greedy_none"] == pytest.approx(row["tokens_per_second"] / greedy["tokens_per_second"])
    assert "top-k 20 top-p 0.9" in res.output and "host ms/token" in res.output
    assert "vs greedy" in res.output and "what sampling costs plain decoding" in res.output
    res = CliRunner().invoke(main, ["bench", "--bundle", str(close_bundle), "--methods", "none", "--max-new-tokens",
                                    "4", "--repeats", "1", "--temperature", "0.8", "--no-greedy-baseline",
                                    "--json", str(out)])
    assert res.exit_code == 0 and "vs greedy" not in res.output, res.output
    assert "greedy_baseline" not in json.loads(out.read_text())
    res = CliRunner().invoke(main, ["bench", "--bundle", str(close_bundle), "--top-p", "1.5"])
    assert res.exit_code == 1 and "top_p must be in (0, 1]" in res.output


def test_bench_chat_renders_each_prompt_as_a_users_message(chat_bundle, monkeypatch):
    import specrt

    gen = specrt.load(chat_bundle, threads=1)
    seen = []
    original = gen.stream_ids
    monkeypatch.setattr(gen, "stream_ids", lambda ids, *a, **k: seen.append(list(ids)) or original(ids, *a, **k))
    res = run_bench(gen, ["hi"], BenchConfig(methods=("none", "ngram"), max_new_tokens=4, repeats=1, chat=True))
    assert res["config"]["chat"] is True
    chat_ids = gen.encode_chat([{"role": "user", "content": "hi"}])
    assert chat_ids != gen.encode("hi") and seen and all(ids == chat_ids for ids in seen)


def test_bench_measures_what_the_bundle_holds_unless_told(generator, chat_bundle, tmp_path):
    """The default --methods fits the bundle: a target-only one gets none and ngram, not a draft it lacks."""
    from click.testing import CliRunner

    from specrt.cli import main
    from specrt.measure.bench import default_methods

    assert default_methods(generator) == ("none", "draft", "tree", "ngram")
    m = generator.manifest  # a gqa-static bundle's graphs are causal only: no tree methods
    static = dataclasses.replace(m, models={r: dataclasses.replace(e, graph="gqa-static") for r, e in m.models.items()})
    assert default_methods(types.SimpleNamespace(manifest=static)) == ("none", "draft", "ngram")
    out = tmp_path / "b.json"
    res = CliRunner().invoke(main, ["bench", "--bundle", str(chat_bundle), "--max-new-tokens", "4", "--repeats", "1",
                                    "--json", str(out)])
    assert res.exit_code == 0, res.output
    result = json.loads(out.read_text())
    assert list(result["methods"]) == ["none", "ngram"]
    # An instruct bundle is measured as it is used: its chat prompts, in its template, unless told otherwise.
    assert result["config"]["chat"] is True and result["config"]["prompts"] == 8
    res = CliRunner().invoke(main, ["bench", "--bundle", str(chat_bundle), "--max-new-tokens", "4", "--repeats", "1",
                                    "--methods", "none", "--no-chat", "--json", str(out)])
    assert res.exit_code == 0, res.output
    result = json.loads(out.read_text())
    assert result["config"]["chat"] is False and result["config"]["prompts"] == len(builtin_prompts("code"))


def test_bytes_per_token_count_what_drafted(eagle_bundle):
    """eagle's draft passes read the EAGLE-3 head's weights and cache, not nothing (nor a draft model's)."""
    import specrt
    from specrt.bundle.files import entry_cost
    from specrt.bundle.manifest import load_manifest
    from specrt.measure import roofline

    gen = specrt.load(eagle_bundle, threads=1)
    res = run_bench(gen, builtin_prompts("code")[:1], BenchConfig(methods=("none", "eagle"), max_new_tokens=10))
    m = load_manifest(eagle_bundle)
    assert res["config"]["model_costs"]["eagle"]["weight_bytes"] == entry_cost(eagle_bundle, m.eagle).weight_bytes
    row, none = res["methods"]["eagle"], res["methods"]["none"]
    ctx = row["mean_context"]
    target = roofline.PassBytes(entry_cost(eagle_bundle, m.target).weight_bytes,
                                roofline.kv_bytes_per_position(m.target.dims, m.target.dtype) * ctx)
    head = roofline.PassBytes(entry_cost(eagle_bundle, m.eagle).weight_bytes,
                              roofline.kv_bytes_per_position(m.eagle.dims, m.eagle.dtype) * ctx)
    assert row["draft_passes_per_token"] > 0
    assert row["bytes_per_token"] == pytest.approx(roofline.bytes_per_token(
        1.0, row["target_passes_per_token"], target, row["draft_passes_per_token"], head))
    assert row["ops_factor"] > row["target_passes_per_token"] * (row["mean_gamma"] + 1)  # the head's FLOPs too
    assert none["draft_passes_per_token"] == 0


def test_a_method_that_left_plain_decoding_is_explained_where_it_is_printed(generator, capsys):
    from specrt.measure.report import DIFFERS_FROM_NONE, print_bench

    res = run_bench(generator, builtin_prompts("code")[:1], BenchConfig(methods=("none", "draft"), max_new_tokens=4,
                                                                          repeats=1))
    print_bench(res)
    assert "= none NO" not in capsys.readouterr().out
    res["methods"]["draft"]["greedy_matches_none"] = False  # as a quantized target's near-tie would make it
    print_bench(res)
    out = capsys.readouterr().out
    assert " NO" in out and " ".join(DIFFERS_FROM_NONE.split()[:6]) in " ".join(out.split())
    assert "--row-stable" in out and "specrt verify" in out
