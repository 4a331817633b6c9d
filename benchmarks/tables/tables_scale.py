"""Tables of the scale studies: a model at real dimensions at int4, real vocabularies, real model families at
real sizes and their memory. Registered on import; tables.py imports this module.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from generated_blocks import table
from table_format import _bytes_change, _duration, _e, _f, _gb, _kb, _md, _pct, _sig, _x, _yes, DTYPE  # noqa: F401

SETTING = {"greedy": "greedy", "T1.0": "T 1.0", "T0.8 top-p 0.9": "T 0.8, top-p 0.9",
           "T0.8 top-k 50": "T 0.8, top-k 50"}


# ---- a real-dimension model at int4 ------------------------------------------------------------------------

@table("llama-1b-int4-cpu", "scale/llama-1b-int4-cpu.json")
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


table("llama-1b-int4-xeon-cpu", "scale/llama-1b-int4-xeon-cpu.json")(llama_int4)


# ---- real vocabularies -------------------------------------------------------------------------------------

@table("real-vocab-cpu-step", "host-work/real-vocab-cpu.json")
def real_vocab_step(data: dict) -> str:
    work = data["step_work"]
    settings = list(next(iter(work.values())))
    return _md(["one γ = 4 step's numpy work, ms: dense float64 (before) → now",
                *[f"V = {int(v):,}" for v in work]],
               [[SETTING.get(s, s), *[f"{_sig(work[v][s]['dense_reference_ms'], 3)} → "
                                      f"{_sig(work[v][s]['runtime_ms'], 2)}" for v in work]] for s in settings])


@table("real-vocab-cpu", "host-work/real-vocab-cpu.json")
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


@table("real-vocab-cpu-draft", "host-work/real-vocab-cpu.json")
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


@table("real-vocab-cpu-device-logits", "host-work/real-vocab-cpu.json")
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


@table("real-vocab-ratio-cpu", "host-work/real-vocab-ratio-cpu.json")
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


@table("scale-check", "scale/scale-check.json", "scale/low-memory.json")
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


@table("low-memory", "scale/low-memory.json")
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
    """benchmarks/side-by-side/export_ab.py: two exports of one model (before and after a graph change), alternating."""
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


table("logits-rows-cpu", "side-by-side/logits-rows-cpu.json")(export_ab)
table("skip-norm-cpu", "side-by-side/skip-norm-cpu.json")(export_ab)
table("integer-halves-xeon-cpu", "integer-kernel/integer-halves-xeon-cpu.json")(export_ab)
table("eagle-prune-xeon-cpu", "eagle/eagle-prune-xeon-cpu.json")(export_ab)


def thread_pool(data: dict) -> str:
    """benchmarks/host-work/thread_pool.py: `specrt bench` processes with a pool per model and one shared pool,
    alternating."""
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


table("thread-pool-cpu", "host-work/thread-pool-cpu.json")(thread_pool)


def plain_floor(data: dict) -> str:
    """benchmarks/host-work/plain_floor.py: specrt's plain decoding against a minimal Python loop over the same
    graph."""
    return _md(["bundle", "prompts × rounds", "same tokens", "specrt / minimal loop, speed (median of pairs)",
                "quartiles", "ms per token, specrt", "ms per token, minimal loop"],
               [[name, f"{b['prompts']} × {data['rounds']}", f"{b['same_tokens']} / {b['prompts']}",
                 f"{b['specrt_over_minimal_speed']:.2f}×", f"{b['quartiles'][0]:.2f}-{b['quartiles'][1]:.2f}",
                 f"{b['ms_per_token']['specrt']:.2f}", f"{b['ms_per_token']['minimal']:.2f}"]
                for name, b in data["bundles"].items()])


table("plain-floor-cpu", "host-work/plain-floor-cpu.json")(plain_floor)


def auto_gamma(data: dict) -> str:
    """benchmarks/auto-gamma/auto_gamma.py: `--gamma auto` against fixed chains and its earlier α estimate, one
    process."""
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


table("auto-gamma-cpu", "auto-gamma/auto-gamma-cpu.json")(auto_gamma)
table("auto-gamma-weights-cpu", "auto-gamma/auto-gamma-weights-cpu.json")(auto_gamma)
