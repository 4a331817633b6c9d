"""Tables of the one-off studies (benchmarks/*/*.py scripts and `specrt bench` runs compared side by side):
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
    """benchmarks/verify-cost/verify_cost.py: one target pass of r rows against one row, per bundle, with the fit."""
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
    """benchmarks/side-by-side/side_by_side.py: each engine in its own processes, medians over rounds, against the first
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
    """benchmarks/side-by-side/context_scaling.py: one plain decode step against the context it reads, per engine."""
    ctx = [str(n) for n in data["contexts"]]
    rows = [[label, *(f"{e['step_ms'][n]:.1f} ms ({1000 / e['step_ms'][n]:.0f}/s)" for n in ctx),
             _x(e["step_ms"][ctx[-1]] / e["step_ms"][ctx[0]])] for label, e in data["engines"].items()]
    return _md(["engine, weights", *(f"{n} positions" for n in ctx), f"{ctx[-1]} vs {ctx[0]}"], rows)


def serve_replicas(data: dict) -> str:
    """benchmarks/serve/serve_replicas.py: `specrt serve` as one process, 1 and 2 Ray replicas, the same streaming load;
    medians over rounds, tokens/s against 1 replica."""
    o, base = data["options"], data["configs"]["ray-1"]["tokens_per_second"]
    return _md(["host", f"tokens/s ({o['clients']} streaming clients)", "vs 1 replica", "time to first token p50",
                "p95"],
               [[c["label"], _f(c["tokens_per_second"], ".0f"), _x(c["tokens_per_second"] / base),
                 f"{1000 * c['ttft_p50_s']:.0f} ms", f"{1000 * c['ttft_p95_s']:.0f} ms"]
                for c in data["configs"].values()])


table("serve-replicas-cpu", "serve/serve-replicas-cpu.json")(serve_replicas)
table("smollm2-side-by-side-cpu", "side-by-side/smollm2-side-by-side-cpu.json")(side_by_side)
table("smollm2-side-by-side-eagle3-cpu", "side-by-side/smollm2-side-by-side-eagle3-cpu.json")(side_by_side)
table("smollm2-side-by-side-r8-cpu", "side-by-side/smollm2-side-by-side-r8-cpu.json")(side_by_side)
table("smollm2-side-by-side-r9-cpu", "side-by-side/smollm2-side-by-side-r9-cpu.json")(side_by_side)
table("smollm2-side-by-side-xeon-cpu", "side-by-side/smollm2-side-by-side-xeon-cpu.json")(side_by_side)
table("smollm2-int8-integer-xeon-cpu", "integer-kernel/smollm2-int8-integer-xeon-cpu.json")(side_by_side)
table("smollm2-side-by-side-integer-xeon-cpu", "side-by-side/smollm2-side-by-side-integer-xeon-cpu.json")(side_by_side)
table("smollm2-side-by-side-zen4-cpu", "side-by-side/smollm2-side-by-side-zen4-cpu.json")(side_by_side)
table("smollm2-side-by-side-xeon-1205-cpu", "side-by-side/smollm2-side-by-side-xeon-1205-cpu.json")(side_by_side)
table("llama-1b-int8-integer-xeon-cpu", "integer-kernel/llama-1b-int8-integer-xeon-cpu.json")(side_by_side)
table("smollm2-int8-kernels-zen4-cpu", "integer-kernel/smollm2-int8-kernels-zen4-cpu.json")(side_by_side)
table("llama-1b-int8-kernels-zen4-cpu", "integer-kernel/llama-1b-int8-kernels-zen4-cpu.json")(side_by_side)
table("demo-int4-side-by-side-cpu", "demo/demo-int4-side-by-side-cpu.json")(side_by_side)
table("demo-int4-none-vs-genai-cpu", "demo/demo-int4-none-vs-genai-cpu.json")(side_by_side)
table("demo-int4-side-by-side-xeon-cpu", "demo/demo-int4-side-by-side-xeon-cpu.json")(side_by_side)
table("demo-int4-side-by-side-xeon-1205-cpu", "demo/demo-int4-side-by-side-xeon-1205-cpu.json")(side_by_side)
table("smollm2-int8-vs-q8-cpu", "side-by-side/smollm2-int8-vs-q8-cpu.json")(side_by_side)
table("smollm2-r6-int8-vs-llama-cpu", "side-by-side/smollm2-r6-int8-vs-llama-cpu.json")(side_by_side)
table("smollm2-r6-q41-vs-llama-cpu", "side-by-side/smollm2-r6-q41-vs-llama-cpu.json")(side_by_side)
table("smollm2-gguf-head-default-cpu", "side-by-side/smollm2-gguf-head-default-cpu.json")(side_by_side)
table("smollm2-gguf-auto-cpu", "side-by-side/smollm2-gguf-auto-cpu.json")(side_by_side)
table("smollm2-gguf-auto-t07-cpu", "side-by-side/smollm2-gguf-auto-t07-cpu.json")(side_by_side)
table("smollm2-gguf-auto-final-cpu", "side-by-side/smollm2-gguf-auto-final-cpu.json")(side_by_side)
table("smollm2-gguf-auto-final-t07-cpu", "side-by-side/smollm2-gguf-auto-final-t07-cpu.json")(side_by_side)
table("smollm2-gguf-auto-interleaved-cpu", "side-by-side/smollm2-gguf-auto-interleaved-cpu.json")(side_by_side)
table("smollm2-gguf-auto-interleaved-t07-cpu", "side-by-side/smollm2-gguf-auto-interleaved-t07-cpu.json")(side_by_side)
table("smollm2-gguf-nohead-interleaved-t07-cpu", "side-by-side/smollm2-gguf-nohead-interleaved-t07-cpu.json")(side_by_side)
table("smollm2-gguf-nohead-interleaved-t1-cpu", "side-by-side/smollm2-gguf-nohead-interleaved-t1-cpu.json")(side_by_side)


table("smollm2-side-by-side-pruned-xeon-cpu", "side-by-side/smollm2-side-by-side-pruned-xeon-cpu.json")(side_by_side)
table("smollm2-side-by-side-pruned-2-xeon-cpu", "side-by-side/smollm2-side-by-side-pruned-2-xeon-cpu.json")(side_by_side)


def host_work(data: dict) -> str:
    """benchmarks/host-work/host_work.py: host work per token in the loop and warm, and the least step's cost cold."""
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


table("host-work-cpu", "host-work/host-work-cpu.json")(host_work)


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


table("host-work-sampled-cpu", "host-work/host-work-sampled-cpu.json")(host_work_ab)


def row_numerics(data: dict) -> str:
    """benchmarks/verify-cost/row_numerics.py: the last prompt row by an r-row pass against the prefill's."""
    rows = []
    for name, b in data["bundles"].items():
        what = f"int{b['quantization']}" if b["quantization"] else b["dtype"]
        rows.append([f"{name} ({what}, {b['graph']})", str(b["prompts"]),
                     *(_e(b["max_abs_logit_diff"][str(r)]) if b["max_abs_logit_diff"][str(r)] else "0"
                       for r in data["rows"]),
                     _pct(b["top1_same"]["1"])])
    return _md(["target", "prompts", *(f"{r} row{'s' * (r > 1)}" for r in data["rows"]),
                "same top token, 1 row"], rows)


table("row-numerics-cpu", "verify-cost/row-numerics-cpu.json")(row_numerics)


def row_stable(data: dict) -> str:
    """Two `specrt bench` runs of one bundle, plain and with --row-stable: speed, cost and greedy parity."""
    base = next(iter(data["runs"].values()))["methods"]["none"]["tokens_per_second"]
    rows = [[label, method, f"{m['tokens_per_second']:.1f}", _x(m["speedup_vs_none"] or 1.0),
             _x(m["tokens_per_second"] / base), f"{m['target_pass_ms']:.1f} ms", _yes(m["greedy_matches_none"])]
            for label, run in data["runs"].items() for method, m in run["methods"].items()]
    return _md(["run", "method", "tokens/s", "vs none, same run", "vs plain none", "target pass",
                "greedy = none"], rows)


table("smollm2-int8-row-stable-cpu", "verify-cost/smollm2-int8-row-stable-cpu.json")(row_stable)


def prefix_reuse(data: dict) -> str:
    """benchmarks/serve/prefix_reuse.py: time to first token per turn, the history fed whole or reused."""
    rows = []
    for t, (f, r) in enumerate(zip(data["turns"]["fresh"], data["turns"]["reuse_prefix"])):
        rows.append([str(t + 1), f"{f['prompt_tokens']:.0f}", f"{r['reused_tokens']:.0f}",
                     f"{f['first_token_ms']:.0f} ms", f"{r['first_token_ms']:.0f} ms",
                     _x(f["first_token_ms"] / r["first_token_ms"], ".1f"), f"{f['turn_s']:.2f} s", f"{r['turn_s']:.2f} s"])
    return _md(["turn", "prompt tokens", "kept from the last turn", "first token, fed whole",
                "first token, reuse_prefix", "faster", "turn, fed whole", "turn, reuse_prefix"], rows)


table("prefix-reuse-cpu", "serve/prefix-reuse-cpu.json")(prefix_reuse)
table("prefix-reuse-row-stable-cpu", "serve/prefix-reuse-row-stable-cpu.json")(prefix_reuse)
table("verify-cost-cpu", "verify-cost/verify-cost-cpu.json")(verify_cost)
table("verify-cost-gqa-cpu", "verify-cost/verify-cost-gqa-cpu.json")(verify_cost)
table("verify-cost-integer-cpu", "verify-cost/verify-cost-integer-cpu.json")(verify_cost)
table("verify-cost-xeon-cpu", "verify-cost/verify-cost-xeon-cpu.json")(verify_cost)
table("verify-cost-integer-xeon-cpu", "verify-cost/verify-cost-integer-xeon-cpu.json")(verify_cost)
table("verify-cost-integer-kernel-xeon-cpu", "integer-kernel/verify-cost-integer-kernel-xeon-cpu.json")(verify_cost)
table("verify-cost-integer-kernel-1b-xeon-cpu", "integer-kernel/verify-cost-integer-kernel-1b-xeon-cpu.json")(verify_cost)
table("verify-cost-integer-kernel-zen4-cpu", "integer-kernel/verify-cost-integer-kernel-zen4-cpu.json")(verify_cost)
table("verify-cost-integer-kernel-1b-zen4-cpu", "integer-kernel/verify-cost-integer-kernel-1b-zen4-cpu.json")(verify_cost)


@table("matmul-stream-xeon-cpu", "verify-cost/matmul-stream-xeon-cpu.json")
def matmul_stream(data: dict) -> str:
    """benchmarks/verify-cost/matmul_stream.py: a whole target pass beside its matmuls alone, medians over rounds."""
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


@table("verify-cost-h200", "gpu/verify-cost-h200.json")
def verify_cost_gpu(data: dict) -> str:
    """benchmarks/gpu/verify_cost_gpu.py: one target pass of r rows against one row on a GPU, with the fit."""
    rows = []
    for name, m in data["models"].items():
        f = m["fit"]
        rows.append([name, f"{m['weight_bytes'] / 1e6:.0f} MB", f"{m['ms']['1']:.2f} ms",
                     *(_x(f["ratio"][r]) for r in ("2", "5", "8", "16", "32", "64")),
                     f"{f['per_row_ms'] * 1e3:.1f} µs", f"{f['gb_per_s_at_1']:.0f} GB/s"])
    return _md(["target (fp16, random weights)", "weights", "1 row", "2 rows", "5", "8", "16", "32", "64",
                "each extra row", "weights read at 1 row"], rows)


@table("integer-matmul-xeon-cpu", "verify-cost/integer-matmul-xeon-cpu.json")
def integer_quality(data: dict) -> str:
    """benchmarks/verify-cost/integer_matmul.py runs: each integer graph's distance from the float one (specrt's int8
    gate: mean KL <= 0.01, decisive top-1 >= 0.95) on the shipped and the held-out chat prompts, and its pass times."""
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
table("context-scaling-cpu", "side-by-side/context-scaling-cpu.json")(context_scaling)


# ---- the demo pair at every precision ----------------------------------------------------------------------

def _graph_label(graph: str) -> str:
    return "specrt int4, portable graph" if graph == "int4-portable" else f"specrt {graph}"


@table("quantized-demo-cpu", "demo/quantized-demo-cpu.json")
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


@table("quantized-demo-cpu-verify", "demo/quantized-demo-cpu.json")
def quantized_verify(data: dict) -> str:
    costs = data["verify_cost_over_one_token"]
    qs = [k for k in next(iter(costs.values())) if k.startswith("Q=") and not k.endswith("ms") and k != "Q=1"]
    return _md(["graph", "one token (Q=1)", *[f"{k} tokens / 1" for k in qs]],
               [[_graph_label(g), f"{c['Q=1 ms']:.2f} ms", *[_x(c[k]) for k in qs]] for g, c in costs.items()])


@table("quantized-demo-cpu-parity", "demo/quantized-demo-cpu.json")
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


@table("demo-int8-default-check", "demo/demo-int8-default-check.json")
def int8_check(data: dict) -> str:
    tps, mismatches = data["tokens_per_second"], data["greedy_mismatches_of_27"]
    base = tps["fp32"]
    return _md(["demo bundle", "greedy draft / tree / medusa ≠ none (of 27)", "tokens/s none / draft",
                "vs fp32 none / draft"],
               [[name, str(mismatches[name]), f"{t['none']:.1f} / {t['draft']:.1f}",
                 f"{t['none'] / base['none']:.2f}× / {t['draft'] / base['draft']:.2f}×"] for name, t in tps.items()])


@table("demo-old-vs-new-runtime", "demo/demo-old-vs-new-runtime.json")
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


@table("greedy-parity-xeon-cpu", "integer-kernel/greedy-parity-xeon-cpu.json")
def greedy_parity(data: dict) -> str:
    """benchmarks/integer-kernel/greedy_parity.py: greedy generations that leave plain decoding's tokens, per bundle and
    method."""
    rows = [[Path(bundle).name, method, f"{r['differ']} of {r['generations']}",
             ", ".join(map(str, sorted(r["first_difference"]))) or "–"]
            for bundle, methods in data["bundles"].items() for method, r in methods.items()]
    return _md(["bundle", "method", "greedy generations that leave `none`'s tokens", "first different token"], rows)


@table("startup-smollm2-xeon-cpu", "host-work/startup-smollm2-xeon-cpu.json")
def startup(data: dict) -> str:
    """benchmarks/host-work/startup.py runs: one `specrt run` process, start to exit, per way of getting the verify-cost
    curve, each run's figures against its own measured-curve runs."""
    rows = []
    for label, run in data["runs"].items():
        base = run["median_s"]["auto, curve measured"]
        rows += [[label, way, f"{run['median_s'][way]:.2f}", _x(base / run["median_s"][way]),
                  " · ".join(f"{s:.2f}" for s in seconds)] for way, seconds in run["seconds"].items()]
    return _md(["runtime", "`specrt run` (a fresh process each)", "seconds, start to exit (median)",
                "vs measuring the curve", "each round"], rows)
