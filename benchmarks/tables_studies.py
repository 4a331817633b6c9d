"""Tables of the one-off studies (benchmarks/*.py scripts and `specrt bench` runs compared side by side):
verify cost, context scaling, side by side with peers, host work, row numerics, quantization (real
dimensions, vocabularies, scale and memory: tables_scale.py). Registered on import; tables.py imports this
module.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from generated_blocks import table
from table_format import _bytes_change, _duration, _e, _f, _gb, _kb, _md, _pct, _sig, _x, _yes, DTYPE  # noqa: F401

def verify_cost(data: dict) -> str:
    """benchmarks/verify_cost.py: one target pass of r rows against one row, per bundle, with the fit."""
    rows = []
    for b in data["bundles"]:
        f, devices = b["fit"], {d["device"]: d for d in b["devices"]}
        label = b["precision"] + (f" ({b['format']} blocks)" if b["format"] == "gguf" else
                                  f" (blocks of {b['block_size']})" if b["block_size"] else
                                  f" ({b['format']})" if b["format"] else "")
        rows.append([label, f"{b['weight_bytes'] / 1e6:.0f} MB", f"{b['ms']['1']:.2f} ms",
                     *(_x(f["ratio"][r]) for r in ("2", "3", "5", "9", "16")),
                     f"{f['per_row_ms']:.2f} ms ({f['gflop_per_s_per_row']:.0f} GFLOP/s)",
                     *(f"{d['crossover_rows']:.0f}" for d in devices.values()),
                     f"{b['rows_vs_single']['max_abs_logit_diff']:.1e}"])
    names = [d["device"] for d in data["bundles"][0]["devices"]]
    return _md(["target", "weights", "1 row", "2 rows", "3", "5", "9", "16", "each extra row",
                *(f"rows free on {n}" for n in names), "largest logit change, 16 rows vs one by one"], rows)


def _llama_args(args: str) -> str:
    """'spec-type draft-eagle3 -md h.gguf --spec-draft-n-max 1' -> 'draft-eagle3 (h.gguf), ≤ 1 draft'."""
    words = ("--" + args).split()
    value = {k: v for k, v in zip(words, words[1:])}
    n = value.get("--spec-draft-n-max")
    return (f"{value.get('--spec-type', 'speculative')} ({value.get('-md', 'no draft model')})"
            + (f", ≤ {n} draft{'s' * (n != '1')}" if n else ""))


def side_by_side(data: dict) -> str:
    """benchmarks/side_by_side.py: each engine in its own processes, medians over rounds, against the first
    row: the ratio of the medians and the median of each round's ratio (the VM's drift cancelled)."""
    rows, kept = [], data.get("llama_acceptance", {})
    first = next(iter(data["tokens_per_second"]))
    rounds = {f"{name} · {m}": [r[m] for r in reps] for name, reps in data["runs"].items() for m in reps[0]}
    for name, tps in data["tokens_per_second"].items():
        engine, method = name.split(" · ")
        engine, _, args = engine.partition(" --")  # llama.cpp's speculative runs: their arguments
        per_round = statistics.median(a / b for a, b in zip(rounds[name], rounds[first]))
        row = [engine, _llama_args(args) if args else method, _f(tps, ".0f"),
               _x(tps / data["tokens_per_second"][first]), _x(per_round)]
        rows.append(row + ([_f(kept[name], ".2f") if name in kept else "–"] if kept else []))
    return _md(["engine, weights (own processes)", "method", "tokens/s (median)", "vs the first row",
                "each round vs the first row (median)", *(["llama.cpp's drafts kept"] if kept else [])], rows)


def context_scaling(data: dict) -> str:
    """benchmarks/context_scaling.py: one plain decode step against the context it reads, per engine."""
    ctx = [str(n) for n in data["contexts"]]
    rows = [[label, *(f"{e['step_ms'][n]:.1f} ms ({1000 / e['step_ms'][n]:.0f}/s)" for n in ctx),
             _x(e["step_ms"][ctx[-1]] / e["step_ms"][ctx[0]])] for label, e in data["engines"].items()]
    return _md(["engine, weights", *(f"{n} positions" for n in ctx), f"{ctx[-1]} vs {ctx[0]}"], rows)


def serve_replicas(data: dict) -> str:
    """benchmarks/serve_replicas.py: `specrt serve` as one process, 1 and 2 Ray replicas, the same streaming load;
    medians over rounds, tokens/s against 1 replica."""
    o, base = data["options"], data["configs"]["ray-1"]["tokens_per_second"]
    return _md(["host", f"tokens/s ({o['clients']} streaming clients)", "vs 1 replica", "time to first token p50",
                "p95"],
               [[c["label"], _f(c["tokens_per_second"], ".0f"), _x(c["tokens_per_second"] / base),
                 f"{1000 * c['ttft_p50_s']:.0f} ms", f"{1000 * c['ttft_p95_s']:.0f} ms"]
                for c in data["configs"].values()])


table("serve-replicas-cpu", "serve-replicas-cpu.json")(serve_replicas)
table("smollm2-side-by-side-cpu", "smollm2-side-by-side-cpu.json")(side_by_side)
table("smollm2-side-by-side-eagle3-cpu", "smollm2-side-by-side-eagle3-cpu.json")(side_by_side)
table("smollm2-side-by-side-r8-cpu", "smollm2-side-by-side-r8-cpu.json")(side_by_side)
table("smollm2-side-by-side-r9-cpu", "smollm2-side-by-side-r9-cpu.json")(side_by_side)
table("smollm2-side-by-side-xeon-cpu", "smollm2-side-by-side-xeon-cpu.json")(side_by_side)
table("smollm2-int8-integer-xeon-cpu", "smollm2-int8-integer-xeon-cpu.json")(side_by_side)
table("smollm2-side-by-side-integer-xeon-cpu", "smollm2-side-by-side-integer-xeon-cpu.json")(side_by_side)
table("smollm2-side-by-side-zen4-cpu", "smollm2-side-by-side-zen4-cpu.json")(side_by_side)
table("smollm2-side-by-side-xeon-1205-cpu", "smollm2-side-by-side-xeon-1205-cpu.json")(side_by_side)
table("llama-1b-int8-integer-xeon-cpu", "llama-1b-int8-integer-xeon-cpu.json")(side_by_side)
table("smollm2-int8-kernels-zen4-cpu", "smollm2-int8-kernels-zen4-cpu.json")(side_by_side)
table("llama-1b-int8-kernels-zen4-cpu", "llama-1b-int8-kernels-zen4-cpu.json")(side_by_side)
table("demo-int4-side-by-side-cpu", "demo-int4-side-by-side-cpu.json")(side_by_side)
table("demo-int4-none-vs-genai-cpu", "demo-int4-none-vs-genai-cpu.json")(side_by_side)
table("demo-int4-side-by-side-xeon-cpu", "demo-int4-side-by-side-xeon-cpu.json")(side_by_side)
table("demo-int4-side-by-side-xeon-1205-cpu", "demo-int4-side-by-side-xeon-1205-cpu.json")(side_by_side)
table("smollm2-int8-vs-q8-cpu", "smollm2-int8-vs-q8-cpu.json")(side_by_side)
table("smollm2-r6-int8-vs-llama-cpu", "smollm2-r6-int8-vs-llama-cpu.json")(side_by_side)
table("smollm2-r6-q41-vs-llama-cpu", "smollm2-r6-q41-vs-llama-cpu.json")(side_by_side)


def pruned_heads(*runs: dict) -> str:
    """`specrt bench` of one target with an EAGLE-3 head and with that head pruned (`specrt eagle prune`), one
    bundle per run: what the smaller draft LM head saves per drafting pass and costs in tokens per pass."""
    rows = []
    for data in runs:
        cfg, none, tree = data["config"], data["methods"]["none"], data["methods"]["eagle-tree"]
        rows.append([Path(cfg["bundle"]).name, f"{cfg['model_costs']['eagle']['weight_bytes'] / 1e6:.1f} MB",
                     f"{none['tokens_per_second']:.1f}", f"{tree['tokens_per_second']:.1f}",
                     _x(tree["speedup_vs_none"]), f"{tree['tokens_per_target_pass']:.2f}",
                     f"{tree['draft_passes_per_token'] / tree['target_passes_per_token']:.2f}",
                     f"{tree['draft_pass_ms']:.2f} ms", _pct(tree["share_draft"])])
    return _md(["bundle", "head's weights", "none tokens/s", "eagle-tree tokens/s", "eagle-tree vs none",
                "tokens per target pass", "head passes per target pass", "head pass in the loop", "drafting's share"],
               rows)


table("eagle-prune-bench-xeon-cpu", *(f"eagle-prune-bench-{n}-xeon-cpu.json" for n in ("16384", "4096", "2048")))(
    pruned_heads)
table("smollm2-side-by-side-pruned-xeon-cpu", "smollm2-side-by-side-pruned-xeon-cpu.json")(side_by_side)
table("smollm2-side-by-side-pruned-2-xeon-cpu", "smollm2-side-by-side-pruned-2-xeon-cpu.json")(side_by_side)


def head_graphs(data: dict) -> str:
    """`specrt bench` runs of one head in two graphs, back to back: none against eagle, and the head's pass."""
    rows = []
    for label, run in data["runs"].items():
        none, eagle = run["methods"]["none"], run["methods"]["eagle"]
        rows.append([label, f"{none['tokens_per_second']:.1f}", f"{eagle['tokens_per_second']:.1f}",
                     _x(eagle["speedup_vs_none"]), f"{eagle['tokens_per_target_pass']:.2f}",
                     f"{eagle['draft_pass_ms']:.2f} ms", f"{eagle['target_pass_ms']:.1f} ms", f"{eagle['c']:.3f}"])
    return _md(["bundle", "none tokens/s", "eagle tokens/s", "eagle vs none", "tokens / target pass",
                "head pass", "verify pass", "c"], rows)


table("smollm2-eagle3-gqa-head-cpu", "smollm2-eagle3-gqa-head-cpu.json")(head_graphs)
def host_work(data: dict) -> str:
    """benchmarks/host_work.py: host work per token in the loop and warm, and the least step's cost cold."""
    rows = []
    for label, bundles in data["runs"].items():
        for bundle, b in bundles.items():
            loop, warm, step = b["loop"], b["loop_engine_skipped"], b["minimal_step_us"]
            rows.append([label, f"{Path(bundle).name} ({b['graph']}, {b['dtype']})",
                         f"{loop['host_ms_per_token']:.2f} ms", f"{loop['engine_ms_per_token']:.1f} ms",
                         f"{warm['host_ms_per_token']:.3f} ms", *(f"{v:.0f} µs" for v in step.values())])
    first = next(iter(next(iter(data["runs"].values())).values()))
    return _md(["runtime", "bundle", "host / token in the loop", "engine / token", "host / token, engine skipped",
                *(f"mask + bind + argmax, {k}" for k in first["minimal_step_us"])], rows)


table("host-work-cpu", "host-work-cpu.json")(host_work)


def host_work_ab(data: dict) -> str:
    """`specrt bench` processes of two checkouts alternating: host work per token and tokens/s per method."""
    med = lambda xs, k: statistics.median(x[k] for x in xs)  # noqa: E731
    rows = []
    for key, r in data["runs"].items():
        setting, method = key.split("|")
        rows.append([setting, method, *(f"{med(r[s], 'host_ms_per_token'):.2f} ms" for s in ("old", "new")),
                     *(f"{med(r[s], 'tokens_per_second'):.1f}" for s in ("old", "new"))])
    return _md(["decoding", "method", f"host / token, {data['old']}", f"host / token, {data['new']}",
                f"tokens/s, {data['old']}", f"tokens/s, {data['new']}"], rows)


table("host-work-sampled-cpu", "host-work-sampled-cpu.json")(host_work_ab)


def row_numerics(data: dict) -> str:
    """benchmarks/row_numerics.py: the last prompt row by an r-row pass against the prefill's."""
    rows = []
    for name, b in data["bundles"].items():
        what = f"int{b['quantization']}" if b["quantization"] else b["dtype"]
        rows.append([f"{name} ({what}, {b['graph']})", str(b["prompts"]),
                     *(_e(b["max_abs_logit_diff"][str(r)]) if b["max_abs_logit_diff"][str(r)] else "0"
                       for r in data["rows"]),
                     _pct(b["top1_same"]["1"])])
    return _md(["target", "prompts", *(f"{r} row{'s' * (r > 1)}" for r in data["rows"]),
                "same top token, 1 row"], rows)


table("row-numerics-cpu", "row-numerics-cpu.json")(row_numerics)


def row_stable(data: dict) -> str:
    """Two `specrt bench` runs of one bundle, plain and with --row-stable: speed, cost and greedy parity."""
    base = next(iter(data["runs"].values()))["methods"]["none"]["tokens_per_second"]
    rows = [[label, method, f"{m['tokens_per_second']:.1f}", _x(m["speedup_vs_none"] or 1.0),
             _x(m["tokens_per_second"] / base), f"{m['target_pass_ms']:.1f} ms", _yes(m["greedy_matches_none"])]
            for label, run in data["runs"].items() for method, m in run["methods"].items()]
    return _md(["run", "method", "tokens/s", "vs none, same run", "vs plain none", "target pass",
                "greedy = none"], rows)


table("smollm2-int8-row-stable-cpu", "smollm2-int8-row-stable-cpu.json")(row_stable)


def prefix_reuse(data: dict) -> str:
    """benchmarks/prefix_reuse.py: time to first token per turn, the history fed whole or reused."""
    rows = []
    for t, (f, r) in enumerate(zip(data["turns"]["fresh"], data["turns"]["reuse_prefix"])):
        rows.append([str(t + 1), f"{f['prompt_tokens']:.0f}", f"{r['reused_tokens']:.0f}",
                     f"{f['first_token_ms']:.0f} ms", f"{r['first_token_ms']:.0f} ms",
                     _x(f["first_token_ms"] / r["first_token_ms"], ".1f"), f"{f['turn_s']:.2f} s", f"{r['turn_s']:.2f} s"])
    return _md(["turn", "prompt tokens", "kept from the last turn", "first token, fed whole",
                "first token, reuse_prefix", "faster", "turn, fed whole", "turn, reuse_prefix"], rows)


table("prefix-reuse-cpu", "prefix-reuse-cpu.json")(prefix_reuse)
table("prefix-reuse-row-stable-cpu", "prefix-reuse-row-stable-cpu.json")(prefix_reuse)
table("verify-cost-cpu", "verify-cost-cpu.json")(verify_cost)
table("verify-cost-gqa-cpu", "verify-cost-gqa-cpu.json")(verify_cost)
table("verify-cost-integer-cpu", "verify-cost-integer-cpu.json")(verify_cost)
table("verify-cost-xeon-cpu", "verify-cost-xeon-cpu.json")(verify_cost)
table("verify-cost-integer-xeon-cpu", "verify-cost-integer-xeon-cpu.json")(verify_cost)
table("verify-cost-integer-kernel-xeon-cpu", "verify-cost-integer-kernel-xeon-cpu.json")(verify_cost)
table("verify-cost-integer-kernel-1b-xeon-cpu", "verify-cost-integer-kernel-1b-xeon-cpu.json")(verify_cost)
table("verify-cost-integer-kernel-zen4-cpu", "verify-cost-integer-kernel-zen4-cpu.json")(verify_cost)
table("verify-cost-integer-kernel-1b-zen4-cpu", "verify-cost-integer-kernel-1b-zen4-cpu.json")(verify_cost)


@table("matmul-stream-xeon-cpu", "matmul-stream-xeon-cpu.json")
def matmul_stream(data: dict) -> str:
    """benchmarks/matmul_stream.py: a whole target pass beside its matmuls alone, medians over rounds."""
    read, rows = data["read_gbps"], []
    for name, b in data["bundles"].items():
        cells = []
        for q in map(str, data["rows"]):
            whole, alone = b["pass_ms"][q], b["matmuls_ms"][q]
            gbps = b["matmul_weight_bytes"] / alone / 1e6
            cut = f"{b['cut_ms'][q]:.2f} ms ({b['cut_ms'][q] / whole:.0%})" if "cut_ms" in b else "–"
            cells += [f"{whole:.2f} ms", f"{alone:.2f} ms ({alone / whole:.0%})",
                      f"{gbps:.1f} GB/s ({gbps / read:.0%})", cut]
        rows.append([name, b["weights"], f"{b['matmul_weight_bytes'] / 1e6:.0f} MB", *cells])
    head = []
    for q in data["rows"]:
        r = f"{q} row{'s' * (q != 1)}"
        head += [f"pass, {r}", f"matmuls alone, {r} (share)", f"their weights read at, {r} (of {read:.1f} GB/s)",
                 f"pass without its activation ops, {r}"]
    return _md(["bundle", "weights", "matmul weights", *head], rows)


@table("verify-cost-h200", "verify-cost-h200.json")
def verify_cost_gpu(data: dict) -> str:
    """benchmarks/verify_cost_gpu.py: one target pass of r rows against one row on a GPU, with the fit."""
    rows = []
    for name, m in data["models"].items():
        f = m["fit"]
        rows.append([name, f"{m['weight_bytes'] / 1e6:.0f} MB", f"{m['ms']['1']:.2f} ms",
                     *(_x(f["ratio"][r]) for r in ("2", "5", "8", "16", "32", "64")),
                     f"{f['per_row_ms'] * 1e3:.1f} µs", f"{f['gb_per_s_at_1']:.0f} GB/s"])
    return _md(["target (fp16, random weights)", "weights", "1 row", "2 rows", "5", "8", "16", "32", "64",
                "each extra row", "weights read at 1 row"], rows)


@table("eagle-tree-depth-cpu", "eagle-tree-depth-cpu.json")
def eagle_tree_depth(data: dict) -> str:
    """`specrt bench` processes of two checkouts, alternating: per bundle and method, medians of the runs."""
    before, after = data["commits"]["before"], data["commits"]["after"]
    rows = []
    for bundle, sides in data["bundles"].items():
        for method in sides["before"][0]:
            if method == "none":
                continue
            med = {side: {f: statistics.median(r[method][f] for r in runs) for f in
                          ("speedup_vs_none", "tokens_per_target_pass", "draft_passes_per_token")}
                   for side, runs in sides.items()}
            rows.append([bundle, method, *(_x(med[s]["speedup_vs_none"]) for s in ("before", "after")),
                         *(f"{med[s]['tokens_per_target_pass']:.2f}" for s in ("before", "after")),
                         *(f"{med[s]['draft_passes_per_token']:.2f}" for s in ("before", "after"))])
    return _md(["bundle", "method", f"vs none, {before}", f"vs none, {after}", f"tokens / pass, {before}",
                f"tokens / pass, {after}", f"head passes / token, {before}", f"head passes / token, {after}"], rows)


@table("integer-matmul-xeon-cpu", "integer-matmul-xeon-cpu.json")
def integer_quality(data: dict) -> str:
    """benchmarks/integer_matmul.py runs: each integer graph's distance from the float one (specrt's int8 gate:
    mean KL <= 0.01, decisive top-1 >= 0.95) on the shipped and the held-out chat prompts, and its pass times."""
    def quality(r: dict) -> list[str]:
        return [_f(r["parity"]["mean_kl"], ".4f"), _f(r["parity"]["top1_agreement"], ".3f"),
                _f(r["parity_chat"]["mean_kl"], ".4f"), _f(r["parity_chat"]["top1_agreement"], ".3f")]

    rows = []
    if "reference" in data:
        ref = data["reference"]
        rows.append([f"{ref['format']}, blocks of {ref['block_size']} (`specrt quantize --bits int8`)",
                     *quality(ref), "–", "–"])
    for r in data["runs"]:
        rows.append([r["rewrite"]["format"], *quality(r), f"{r['ms']['1']:.2f} ms", _x(r["fit"]["ratio"]["5"])])
    return _md(["int8 graph", "mean KL, shipped prompts", "top-1", "mean KL, chat prompts", "top-1",
                "1 row (its own run)", "5 rows vs 1"], rows)
table("context-scaling-cpu", "context-scaling-cpu.json")(context_scaling)


# ---- the demo pair at every precision ----------------------------------------------------------------------

def _graph_label(graph: str) -> str:
    return "specrt int4, portable graph" if graph == "int4-portable" else f"specrt {graph}"


@table("quantized-demo-cpu", "quantized-demo-cpu.json")
def quantized(data: dict) -> str:
    tps, over, q = data["tokens_per_second"], data["over_ortgenai_int4"], data["config"]["gamma"] + 1
    rows = [[_graph_label(g), f"{tps[f'specrt {g} none']:.0f} / {tps[f'specrt {g} draft']:.0f}",
             f"{over[f'specrt {g} none']:.2f}× / {over[f'specrt {g} draft']:.2f}×",
             f"{data['acceptance'][f'specrt {g} draft']:.2f}", f"{data['bytes'][g]['target'] / 1e6:.0f} MB",
             _x(data["verify_cost_over_one_token"][g][f"Q={q}"]), _yes(data["greedy_draft_equals_none"][g])]
            for g in data["config"]["graphs"]]
    rows.append(["ONNX Runtime GenAI int4 / fp32, plain", f"{tps['ortgenai-int4']:.0f} / {tps['ortgenai-fp32']:.0f}",
                 f"{over['ortgenai-int4']:.2f}× / {over['ortgenai-fp32']:.2f}×", "–", "–", "–", "–"])
    return _md(["", "tokens/s none / draft", "vs ORT GenAI int4 plain", "accepted / drafted", "target bytes",
                f"verify {q} tokens / 1", "greedy draft = none"], rows)


@table("quantized-demo-cpu-verify", "quantized-demo-cpu.json")
def quantized_verify(data: dict) -> str:
    costs = data["verify_cost_over_one_token"]
    qs = [k for k in next(iter(costs.values())) if k.startswith("Q=") and not k.endswith("ms") and k != "Q=1"]
    return _md(["graph", "one token (Q=1)", *[f"{k} tokens / 1" for k in qs]],
               [[_graph_label(g), f"{c['Q=1 ms']:.2f} ms", *[_x(c[k]) for k in qs]] for g, c in costs.items()])


@table("quantized-demo-cpu-parity", "quantized-demo-cpu.json")
def quantized_parity(data: dict) -> str:
    rows = []
    for g, models in data["parity"].items():
        t, d = models["target"], models["draft"]
        rows.append([_graph_label(g), f"{_e(t['mean_kl'])} / {_pct(t['top1_agreement'])}",
                     f"{_e(d['mean_kl'])} / {_pct(d['top1_agreement'])}",
                     f"≤ {t['max_mean_kl']:g} / ≥ {_pct(t['min_top1_agreement'])}",
                     f"{t['decisive_positions']} / {d['decisive_positions']} of {t['positions']}"])
    return _md(["quantized graph", "target: mean KL / top-1", "draft: mean KL / top-1", "threshold: KL / top-1",
                "decisive positions (target / draft)"], rows)


@table("demo-int8-default-check", "demo-int8-default-check.json")
def int8_check(data: dict) -> str:
    tps, mismatches = data["tokens_per_second"], data["greedy_mismatches_of_27"]
    base = tps["fp32"]
    return _md(["demo bundle", "greedy draft / tree / medusa ≠ none (of 27)", "tokens/s none / draft",
                "vs fp32 none / draft"],
               [[name, str(mismatches[name]), f"{t['none']:.1f} / {t['draft']:.1f}",
                 f"{t['none'] / base['none']:.2f}× / {t['draft'] / base['draft']:.2f}×"] for name, t in tps.items()])


@table("demo-old-vs-new-runtime", "demo-old-vs-new-runtime.json")
def old_vs_new(data: dict) -> str:
    methods = list(next(iter(data["runs"].values()))[0])
    rows = []
    for version, runs in data["runs"].items():
        for i, run in enumerate(runs, 1):
            rows.append([version, str(i), *[f"{run[m]['tokens_per_second']:.0f} ({run[m]['speedup_vs_none']:.2f}×)"
                                           for m in methods],
                         _yes(all(run[m]["greedy_matches_none"] for m in methods))])
        rows.append([version, "median", *[
            f"{statistics.median(r[m]['tokens_per_second'] for r in runs):.0f} "
            f"({statistics.median(r[m]['speedup_vs_none'] for r in runs):.2f}×)" for m in methods], "–"])
    return _md(["code version", "run", *[f"`{m}` tokens/s (vs none)" for m in methods], "greedy = none"], rows)


@table("greedy-parity-xeon-cpu", "greedy-parity-xeon-cpu.json")
def greedy_parity(data: dict) -> str:
    """benchmarks/greedy_parity.py: greedy generations that leave plain decoding's tokens, per bundle and method."""
    rows = [[Path(bundle).name, method, f"{r['differ']} of {r['generations']}",
             ", ".join(map(str, sorted(r["first_difference"]))) or "–"]
            for bundle, methods in data["bundles"].items() for method, r in methods.items()]
    return _md(["bundle", "method", "greedy generations that leave `none`'s tokens", "first different token"], rows)


@table("eagle-train-speed-zen4-cpu", "eagle-train-speed-zen4-cpu.json")
def eagle_train_speed(data: dict) -> str:
    """benchmarks/eagle_train_speed.py: the target generating and one training step, float32 against bfloat16."""
    gen, step = data["generate_tokens_per_s"], data["step_s"]
    cfg = data["config"]
    return _md(["cost", "float32", "bfloat16", "bfloat16 vs float32"],
               [[f"generating, {cfg['rows']} rows (tokens/s)", f"{gen['float32']:.0f}", f"{gen['bfloat16']:.0f}",
                 _x(gen["bfloat16"] / gen["float32"])],
                [f"one training step, {cfg['batch_size']} × {cfg['seq_len']} tokens, TTT {cfg['ttt_steps']} (s)",
                 f"{step['float32']:.2f}", f"{step['bfloat16']:.2f}", _x(step["float32"] / step["bfloat16"])]])


@table("eagle-train-bf16-smollm2-cpu", "eagle-train-bf16-smollm2-cpu.json")
def eagle_train_runs(data: dict) -> str:
    """`specrt eagle train` records (training.json) of one recipe: where and in what precision each ran, its
    time by phase and the head's held-out greedy acceptance."""
    rows = []
    for name, r in data["runs"].items():
        t, held = r["time_s"], r["heldout"]
        minutes = (t.get("prompts", 0) + t["generate"] + t["cache"] + t["train"] + t.get("evaluate_init", 0)
                   + t["evaluate"]) / 60
        rows.append([name, r.get("compute", "float32"), f"{t['generate'] / 60:.0f}", f"{t['train'] / 60:.0f}",
                     f"{t['train'] / r['config']['steps']:.1f}", f"{minutes:.0f}", f"{held['alpha1']:.3f}",
                     " / ".join(f"{a:.2f}" for a in held["alpha_by_depth"]), f"{held['tokens_per_pass']:.2f}"])
    return _md(["run", "compute", "generating (min)", "training (min)", "s / step", "in all (min)",
                "held-out α, first draft", "by depth", "tokens / pass at depth 3"], rows)


@table("eagle-variants-smollm2-cpu", "eagle-variants-smollm2-cpu.json")
def eagle_variants(data: dict) -> str:
    """benchmarks/eagle_variants.py: head variants trained from scratch on one cache, same batches and seed;
    held-out greedy acceptance as `specrt eagle train` measures it."""
    rows = []
    for r in data["runs"]:
        held, fields = r["heldout"], r["fields"]
        what = ", ".join(f"{k}={v}" for k, v in fields.items()) or "standard EAGLE-3"
        rows.append([r["variant"], what, f"{sum(r['loss_history'][-50:]) / 50:.3f}", f"{held['kl']:.3f}",
                     f"{held['alpha1']:.3f}", " / ".join(f"{a:.3f}" for a in held["alpha_by_depth"]),
                     f"{held['tokens_per_pass']:.3f}", f"{r['train_s'] / 60:.0f}"])
    return _md(["variant", "fields", "training loss, last 50 steps", "held-out KL", "held-out α, first draft",
                "by depth", f"tokens / pass at depth {data['ttt_steps']}", "training (min)"], rows)


@table("eagle-self-prompts-smollm2-cpu", "eagle-train-r6-smollm2-cpu.json")
def eagle_self_prompts(data: dict) -> str:
    """Round 4's head against round 6's (trained on with prompts SmolLM2 wrote itself): held-out acceptance on
    round 6's held-out prompts, tokens per pass on round 4's human-written held-out prompts, and `specrt bench`
    (medians of the alternating runs; – where a head was not benched)."""
    trainings = {"r10-fp32": data["training"], **data.get("more_trainings", {})}
    runs_by = data["bench"]["runs"]
    methods = [m for m in runs_by["r8-fp32"][0] if m != "none"]
    rows = []
    for bundle, name in data["heads"].items():
        held = trainings[bundle]["heldout"] if bundle in trainings else data["training"]["heldout_init"]
        runs = runs_by.get(bundle)
        bench = ["–"] * len(methods)
        if runs:
            bench = [f"{statistics.median(r[m]['tokens_per_target_pass'] for r in runs):.2f} / "
                     f"{_x(statistics.median(r[m]['speedup_vs_none'] for r in runs))}" for m in methods]
        rows.append([name, f"{held['alpha1']:.3f}", f"{held['tokens_per_pass']:.2f}",
                     f"{data['heldout_r4']['results'][bundle]['tokens_per_pass']:.3f}", *bench])
    return _md(["head", "α1, round 6's held-out (206 prompts)", "tokens / pass there (depth 3)",
                "tokens / pass, round 4's held-out (312 prompts, γ 3)",
                *(f"{m}: tokens / pass / vs none (bench)" for m in methods)], rows)


@table("eagle-mixed-prompts-smollm2-cpu", "eagle-train-r7-smollm2-cpu.json")
def eagle_mixed_prompts(data: dict) -> str:
    """Round 4's head against round 7's (seed prompts and self-written ones together): held-out acceptance on
    round 7's held-out prompts, before and after, and tokens per pass on round 4's human-written held-out."""
    t = data["training"]
    rows = []
    for (bundle, name), held in zip(data["heads"].items(), (t["heldout_init"], t["heldout"])):
        rows.append([name, f"{held['alpha1']:.3f}", f"{held['tokens_per_pass']:.2f}",
                     f"{data['heldout_r4']['results'][bundle]['tokens_per_pass']:.3f}"])
    return _md(["head", f"α1, round 7's held-out ({t['data']['prompts_heldout']} prompts)",
                "tokens / pass there (depth 3)", "tokens / pass, round 4's held-out (312 prompts, γ 3)"], rows)


@table("eagle-stacked-smollm2-cpu", "eagle-stacked-smollm2-cpu.json")
def eagle_stacked(data: dict) -> str:
    """One layer against two at equal data: the same start (round 4's head; the second layer's outputs zero), cache,
    batches and seed; held-out acceptance as `specrt eagle train` measures it, tokens per pass on round 4's
    human-written held-out, and a draft's cost c (`specrt bench`, eagle γ 3) with the same drafts."""
    rows = []
    for r in data["runs"]:
        held, cost = r["training"]["heldout"], r["cost"]
        rows.append([r["head"], str(r["layers"]), f"{held['alpha1']:.3f}",
                     " / ".join(f"{a:.3f}" for a in held["alpha_by_depth"]), f"{held['tokens_per_pass']:.3f}",
                     f"{held['kl']:.3f}", f"{r['heldout_r4']['tokens_per_pass']:.3f}",
                     f"{cost['fp32']['c']:.3f} / {cost['int8']['c']:.3f}"])
    return _md(["head", "layers", "held-out α, first draft", "by depth", "tokens / pass at depth 3", "held-out KL",
                "tokens / pass, round 4's held-out (312 prompts, γ 3)", "c: fp32 target / int8 target"], rows)


@table("eagle-time-limit-smollm2-cpu", "eagle-time-limit-smollm2-cpu.json")
def eagle_time_limit(data: dict) -> str:
    """`specrt eagle train --time-limit 15`, one command three times as the planning changed: the data it made,
    the steps it planned and ran, a step's predicted and real seconds, and the process's wall time."""
    rows = []
    for r in data["runs"]:
        t = r["training"]
        plan, d, times = t["time_limit"], t["data"], t["time_s"]
        ran = len(t["loss"]["history"])
        rows.append([r["planning"], f"{d['prompts_written']} / {d['continuations_made']}",
                     f"{plan['steps']} / {ran}" + (" (stopped at the limit)" if plan["stopped_at_step"] else ""),
                     f"{plan['step_s']:.2f} / {times['train'] / ran:.2f}", f"{r['wall_s'] / 60:.2f} min",
                     f"{t['heldout_init']['alpha1']:.3f} → {t['heldout']['alpha1']:.3f}"])
    return _md(["planning", "prompts written / replies (training)", "steps planned / run",
                "s a step: planned / real", "process wall time (limit 15 min)", "held-out α, first draft"], rows)


@table("tree-host-topk-cpu", "tree-host-topk-cpu.json")
def tree_host_topk(data: dict) -> str:
    """`specrt bench` processes of two checkouts, alternating: host work per token and speed, per run."""
    rows = []
    for side, runs in data["runs"].items():
        for i, r in enumerate(runs, 1):
            rows.append([f"{side} ({data['commits'][side]}), run {i}", f"{r['none']['host_ms_per_token']:.2f}",
                         f"{r['eagle-tree']['host_ms_per_token']:.2f}", f"{r['eagle-tree']['tokens_per_target_pass']:.2f}",
                         _x(r["eagle-tree"]["speedup_vs_none"])])
    return _md(["checkout", "none: host ms / token", "eagle-tree: host ms / token", "eagle-tree: tokens / pass",
                "eagle-tree vs none"], rows)

