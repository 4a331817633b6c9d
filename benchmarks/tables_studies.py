"""Tables of the one-off studies (benchmarks/*.py scripts and `specrt bench` runs compared side by side):
verify cost, context scaling, side by side with peers, host work, row numerics, quantization, real
vocabularies, scale and memory. Registered on import; tables.py imports this module.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from generated_blocks import table
from table_format import _bytes_change, _duration, _e, _f, _gb, _kb, _md, _pct, _sig, _x, _yes, DTYPE  # noqa: F401

SETTING = {"greedy": "greedy", "T1.0": "T 1.0", "T0.8 top-p 0.9": "T 0.8, top-p 0.9",
           "T0.8 top-k 50": "T 0.8, top-k 50"}

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
table("demo-int4-side-by-side-cpu", "demo-int4-side-by-side-cpu.json")(side_by_side)
table("demo-int4-none-vs-genai-cpu", "demo-int4-none-vs-genai-cpu.json")(side_by_side)
table("demo-int4-side-by-side-xeon-cpu", "demo-int4-side-by-side-xeon-cpu.json")(side_by_side)
table("smollm2-int8-vs-q8-cpu", "smollm2-int8-vs-q8-cpu.json")(side_by_side)
table("smollm2-r6-int8-vs-llama-cpu", "smollm2-r6-int8-vs-llama-cpu.json")(side_by_side)
table("smollm2-r6-q41-vs-llama-cpu", "smollm2-r6-q41-vs-llama-cpu.json")(side_by_side)


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


# ---- a real-dimension model at int4 ------------------------------------------------------------------------

@table("llama-1b-int4-cpu", "llama-1b-int4-cpu.json")
def llama_int4(data: dict) -> str:
    s = data["summary"]
    tps, nbytes, frac = s["tokens_per_second"], s["bytes_per_token"], s["roofline_fraction"]
    return _md(["plain decoding (`none`)", "bytes read per token", "tokens/s",
                f"share of the memory roofline ({s['bandwidth']['read_gbps']:.1f} GB/s read)"],
               [["specrt fp32", _gb(nbytes["fp32 none"], ".2f"), f"{tps['fp32 none']:.1f}", _pct(frac["fp32 none"])],
                ["specrt int4 (MatMulNBits, blocks of 32)", _gb(nbytes["int4 none"], ".2f"),
                 f"{tps['int4 none']:.1f} ({s['int4_none_over_fp32_none']:.1f}× fp32)", _pct(frac["int4 none"])],
                ["ONNX Runtime GenAI int4 (its builder, same block size and accuracy level)", "–",
                 f"{s['ortgenai_int4_tokens_per_second']:.1f}", "–"]])


table("llama-1b-int4-xeon-cpu", "llama-1b-int4-xeon-cpu.json")(llama_int4)


# ---- real vocabularies -------------------------------------------------------------------------------------

@table("real-vocab-cpu-step", "real-vocab-cpu.json")
def real_vocab_step(data: dict) -> str:
    work = data["step_work"]
    settings = list(next(iter(work.values())))
    return _md(["one γ = 4 step's numpy work, ms: dense float64 (before) → now",
                *[f"V = {int(v):,}" for v in work]],
               [[SETTING.get(s, s), *[f"{_sig(work[v][s]['dense_reference_ms'], 3)} → "
                                      f"{_sig(work[v][s]['runtime_ms'], 2)}" for v in work]] for s in settings])


@table("real-vocab-cpu", "real-vocab-cpu.json")
def real_vocab(data: dict) -> str:
    cfg, rows = data["config"], []
    for s, b in data["bench"].items():
        m, ratio = b["methods"]["none"], data.get("specrt_none_over_ortgenai", {}).get(s)
        rows.append([SETTING.get(s, s), f"{m['tokens_per_second']:.0f}", _x(data["sampled_over_greedy"][s]["none"]),
                     f"{m['host_ms_per_token']:.2f}", f"{m['target_pass_ms']:.2f} ms",
                     _f(b.get("ortgenai_tokens_per_second"), ".0f"), "–" if ratio is None else _sig(ratio, 3) + "×"])
    return _md([f"`--method none`, {b['config']['prompts']} prompts × {cfg['max_new_tokens']} tokens", "tokens/s",
                "vs greedy", "host ms / token", "target pass", "ONNX Runtime GenAI (same weights, fp32)",
                "specrt / ORT GenAI"], rows)


@table("real-vocab-cpu-draft", "real-vocab-cpu.json")
def real_vocab_draft(data: dict) -> str:
    rows = []
    for s, b in data["bench"].items():
        m, none = b["methods"]["draft"], b["methods"]["none"]
        rows.append([SETTING.get(s, s), f"{m['tokens_per_second']:.0f}",
                     _x(m["tokens_per_second"] / none["tokens_per_second"]), f"{m['tokens_per_target_pass']:.2f}",
                     _f(m["alpha"], ".3f"), f"{m['host_ms_per_token']:.2f}",
                     _x(data["sampled_over_greedy"][s]["draft"])])
    return _md(["`--method draft`, γ 4", "tokens/s", "vs none", "tokens per target pass", "α", "host ms / token",
                "vs greedy"], rows)


@table("real-vocab-cpu-device-logits", "real-vocab-cpu.json")
def real_vocab_device(data: dict) -> str:
    rows = []
    for s, d in data["device_logits"].items():
        none, draft = d["none"], d["draft"]
        whole = draft["target_whole_rows_per_pass"]
        rows.append([SETTING.get(s, s), _kb(none["d2h_bytes_per_target_pass"]),
                     _kb(none["whole_rows_bytes_per_target_pass"]), _kb(draft["d2h_bytes_per_target_pass"]),
                     _kb(draft["whole_rows_bytes_per_target_pass"]), "0" if whole == 0 else f"{whole:.2f}"])
    return _md(["device-to-host bytes per target pass", "`none`: summary", "every row (before)",
                "`draft` γ 4: summary", "every row (before)", "whole rows read per target pass (draft)"], rows)


@table("real-vocab-ratio-cpu", "real-vocab-ratio-cpu.json")
def real_vocab_ratio(data: dict) -> str:
    return _md(["setting", "tokens/s (all rounds summed)", "vs greedy", "single rounds", "host ms / token",
                "engine ms / token"],
               [[SETTING.get(s, s), f"{r['tokens_per_second']:.0f}", _x(r["vs_greedy"]),
                 f"{min(r['vs_greedy_rounds']):.2f}–{max(r['vs_greedy_rounds']):.2f}",
                 f"{r['host_ms_per_token']:.2f}", f"{r['engine_ms_per_token']:.2f}"]
                for s, r in data["settings"].items()])


# ---- real model families at real sizes, memory -------------------------------------------------------------

# JSON family name -> (label of its first row, label of the next); rows print in this order.
FAMILY = {"qwen3-0.6b": ("Qwen3-0.6B dims (151,936 vocab, 28 layers, q/k norms)", "Qwen3-0.6B dims"),
          "llama-3.2-1b": ("Llama-3.2-1B dims (128,256 vocab, llama3 rope)", "Llama-3.2-1B dims"),
          "gemma-2-2b": ("Gemma-2-2B dims (256,000 vocab, 26 layers, soft-caps, windows)", "Gemma-2-2B dims"),
          "phi-3-mini": ("Phi-3-mini dims (3.8 B, 32 layers, packed qkv / gate_up, window 2047)", "Phi-3-mini dims"),
          "phi-3-mini (4 layers)": ("Phi-3-mini widths, 4 of 32 layers",) * 2,
          "gemma-2-2b (4 layers)": ("Gemma-2-2B widths, 4 of 26 layers",) * 2}


def _low_memory_row(low: dict, family: str, dtype: str) -> dict | None:
    return next((v for k, v in low.items() if k.endswith(f"/{family}/bundle-{dtype}")), None)


def _family_order(key: str) -> tuple[int, str]:
    family, dtype = key.rsplit(" ", 1)
    return (list(FAMILY).index(family) if family in FAMILY else len(FAMILY), dtype)


@table("scale-check", "scale-check.json", "low-memory.json")
def scale_check(data: dict, low: dict) -> str:
    rows, seen = [], set()
    for key in sorted(data, key=_family_order):
        r, (family, dtype) = data[key], key.rsplit(" ", 1)
        long, short = FAMILY.get(family, (family, family))
        par = r["parity"]["target"].values()
        parity = (f"{_e(max(p['rel'] for p in par))} / {_e(max(p['kl'] for p in par))} / "
                  f"{_pct(min(p['top1'] for p in par))}")
        # the run's peak RSS: the decode process's own, else the default session's in low-memory.json
        lm = _low_memory_row(low, family, dtype)
        run = r.get("decode_peak_rss_bytes") or (lm and lm["off"]["peak_rss_bytes"])
        run_cell = "–" if not run else _gb(run)
        if lm:
            run_cell += f" (low-memory: {lm['on']['peak_rss_bytes'] / 1e9:.1f})"
        rows.append([short if family in seen else long, DTYPE.get(dtype, dtype), _duration(r["export_s"]),
                     f"{r['peak_rss_bytes'] / 1e9:.1f} / {_gb(r['peak_anon_bytes'])}",
                     _gb(1.5 * r["weight_bytes"] + 2 * 2**30), parity, _yes(r["greedy_draft_equals_none"]), run_cell])
        seen.add(family)
    return _md(["model", "dtype", "export", "peak RSS / anon", "budget: 1.5 × weights + 2 GiB",
                "worst parity (target) rel / KL / top-1", "draft == none", "run: peak RSS"], rows)


def _bundle_label(path: str) -> str:
    if path == "demo":
        return "the shipped demo (fp16)"
    p = Path(path)
    return f"{p.parent.name} dims, {DTYPE.get(p.name.removeprefix('bundle-'), p.name)}"


@table("low-memory", "low-memory.json")
def low_memory(data: dict) -> str:
    rows = []
    for path, r in data.items():
        off, on = r["off"], r["on"]
        rows.append([_bundle_label(path), f"{r['rounds']} × {r['prompts']} prompts × {r['tokens']}",
                     f"{off['none_tokens_per_second']:g} / {off['draft_tokens_per_second']:g}",
                     f"{on['none_tokens_per_second']:g} / {on['draft_tokens_per_second']:g}",
                     f"{r['on_over_off']['none']:.2f}× / {r['on_over_off']['draft']:.2f}×",
                     _bytes_change(off["peak_rss_bytes"], on["peak_rss_bytes"]),
                     _bytes_change(off["peak_anon_bytes"], on["peak_anon_bytes"]),
                     f"{off['load_s']:g} → {on['load_s']:g} s", _yes(r["same_tokens"])])
    return _md(["bundle", "rounds × prompts × tokens", "default: none / draft tokens/s",
                "low-memory: none / draft tokens/s", "low-memory / default", "peak RSS", "peak anonymous",
                "load", "same tokens"], rows)


def export_ab(data: dict) -> str:
    """benchmarks/export_ab.py: two exports of one model (before and after a graph change), alternating."""
    runs = list(data["runs"].items())
    lengths = list(runs[0][1].get("prefill_ms", {}))
    steps = list(runs[0][1].get("step_ms", {}))
    cell = lambda r, f: f"{r['old']:{f}} → {r['new']:{f}} ({r['new_over_old']:.2f}×)" if r else "–"  # noqa: E731
    return _md(["target, method", *(f"prefill, {n} tokens (ms)" for n in lengths),
                *(f"{q}-row step at {runs[0][1]['past']} cached (ms)" for q in steps),
                "tokens/s, 14 chat prompts × 64"],
               [[label, *(cell(r.get("prefill_ms", {}).get(n), ".0f") for n in lengths),
                 *(cell(r.get("step_ms", {}).get(q), ".2f") for q in steps), cell(r.get("tokens_per_second"), ".1f")]
                for label, r in runs])


table("logits-rows-cpu", "logits-rows-cpu.json")(export_ab)
table("skip-norm-cpu", "skip-norm-cpu.json")(export_ab)


def thread_pool(data: dict) -> str:
    """benchmarks/thread_pool.py: `specrt bench` processes with a pool per model and one shared pool, alternating."""
    rows = []
    for label, b in data["bundles"].items():
        med = b["median"]
        for method, shared in med["shared"].items():
            per = med["per-model"][method]
            speedups = [[r[method]["speedup_vs_none"] for r in b["runs"][mode]] for mode in ("per-model", "shared")]
            draft = (f"{per['draft_pass_ms']:.2f} → {shared['draft_pass_ms']:.2f} ms" if per["draft_pass_ms"] else "–")
            rows.append([label, method, f"{per['tokens_per_second']:.1f} → {shared['tokens_per_second']:.1f}",
                         f"{statistics.median(b['shared_over_per_model'][method]):.2f}×",
                         "–" if method == "none" else
                         " → ".join(f"{statistics.median(s):.2f}× ({', '.join(f'{x:.2f}' for x in s)})" for s in speedups),
                         draft, f"{per['target_pass_ms']:.1f} → {shared['target_pass_ms']:.1f} ms"])
    return _md(["bundle", "method", "tokens/s, per-model → shared", "shared / per-model, per round",
                "speedup over none in the same process, per-model → shared (rounds)", "draft or head pass",
                "target pass (verify passes included)"], rows)


table("thread-pool-cpu", "thread-pool-cpu.json")(thread_pool)


def plain_floor(data: dict) -> str:
    """benchmarks/plain_floor.py: specrt's plain decoding against a minimal Python loop over the same graph."""
    return _md(["bundle", "prompts × rounds", "same tokens", "specrt / minimal loop, speed (median of pairs)",
                "quartiles", "ms per token, specrt", "ms per token, minimal loop"],
               [[name, f"{b['prompts']} × {data['rounds']}", f"{b['same_tokens']} / {b['prompts']}",
                 f"{b['specrt_over_minimal_speed']:.2f}×", f"{b['quartiles'][0]:.2f}-{b['quartiles'][1]:.2f}",
                 f"{b['ms_per_token']['specrt']:.2f}", f"{b['ms_per_token']['minimal']:.2f}"]
                for name, b in data["bundles"].items()])


table("plain-floor-cpu", "plain-floor-cpu.json")(plain_floor)


def auto_gamma(data: dict) -> str:
    """benchmarks/auto_gamma.py: `--gamma auto` against fixed chains and its earlier α estimate, one process."""
    rows = []
    for name, b in data["bundles"].items():
        for entry, e in b["entries"].items():
            label = ("auto, α̂ from step means (before)" if entry == "auto (step means)"
                     else f"γ {entry}" if entry.isdigit() else entry)
            chosen = e.get("gamma_chosen")
            total = sum(chosen.values()) if chosen else 0
            mix = ", ".join(f"{g}: {100 * k / total:.0f} %" for g, k in chosen.items() if k / total >= 0.01) \
                if chosen else ""
            rows.append([f"{name} ({b['method']})", label, f"{e['tokens_per_s']:.0f}", _x(e["speedup"]),
                         " ".join(f"{v:.2f}" for v in e["per_round"]), f"{e['tokens_per_pass']:.2f}", mix])
    return _md(["bundle (method)", "γ", "tokens/s", "over none (median of rounds)", "each round",
                "tokens / target pass", "γ chosen (share of steps, ≥ 1 %)"], rows)


table("auto-gamma-cpu", "auto-gamma-cpu.json")(auto_gamma)
table("auto-gamma-weights-cpu", "auto-gamma-weights-cpu.json")(auto_gamma)
