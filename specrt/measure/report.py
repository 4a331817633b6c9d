"""Human-readable figures for the terminal (rich), kept out of the library's data classes."""

from __future__ import annotations

from ..runtime.drafters import proposes_trees
from ..runtime.stats import GenerationStats


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def print_stats(st: GenerationStats, provider: str, lossy: bool = False,
                measured_speedup: float | None = None, graphs: str | None = None) -> None:
    """``graphs``: the target decoder's ``graph_status`` where it has one (ONNX Runtime CUDA: the captured
    buckets, or why its steps ran eagerly)."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"specrt run · method {st.method} · {provider}", show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column(justify="right")
    t.add_column(style="dim")
    t.add_row("new tokens", str(st.new_tokens), f"{st.target_passes} target passes, {st.draft_passes} draft passes")
    t.add_row("tokens per target pass", _fmt(st.tokens_per_target_pass, ".2f"), "plain decoding = 1.00")
    if st.drafted:
        tree = proposes_trees(st.method)
        t.add_row("acceptance (accepted/drafted)", _fmt(st.acceptance_rate), f"{st.accepted}/{st.drafted}"
                  + (" tree nodes" if tree else ""))
        if st.alpha_estimate is not None:
            t.add_row("alpha (mean sum min(p,q))", _fmt(st.alpha_estimate), "Leviathan et al.'s estimator")
        t.add_row("tree nodes per pass" if tree else "mean gamma", _fmt(st.mean_gamma, ".2f"), "")
        t.add_row("accepted per depth", "", " ".join(f"{x:.2f}" for x in st.accepted_per_depth[:8]))
        t.add_row("c (draft pass / target pass)", _fmt(st.c), "")
        if st.predicted_speedup is not None and not tree:
            t.add_row("predicted speedup", _fmt(st.predicted_speedup, ".2f") + "x",
                      "(1-a^(g+1))/(1-a) / (g c + 1)" + (f" / v(g+1) = {st.verify_cost:.2f}, the measured verify "
                                                         "cost" if st.verify_cost else "")
                      + "; measure it with --baseline")
    if st.switch:
        t.add_row("auto's switch", f"{st.paused_steps}/{st.target_passes - 1} plain", st.switch)
    elif st.paused_steps:
        t.add_row("drafting paused", f"{st.paused_steps}/{st.target_passes - 1}", "steps whose lookup was not verified: "
                  "at its measured acceptance no prefix beat a plain step's cost")
    t.add_row("tokens/s", _fmt(st.tokens_per_second, ".1f"), f"{st.total_s * 1000:.0f} ms in all")
    if measured_speedup is not None:
        t.add_row("measured speedup", f"{measured_speedup:.2f}x", "vs --method none, same prompt and backend")
    t.add_row("time split", "", f"prefill {st.prefill_s * 1000:.0f} ms · draft {st.draft_s * 1000:.0f} ms · "
              f"verify {st.verify_s * 1000:.0f} ms · other {st.other_s * 1000:.0f} ms")
    t.add_row("host time per token", f"{st.host_ms_per_token:.3f} ms",
              f"outside the engines' run calls (binding counts); engines {st.engine_s * 1000:.0f} ms")
    if graphs:
        t.add_row("CUDA graphs", "yes" if graphs.startswith("CUDA graphs:") else "no",
                  graphs.removeprefix("CUDA graphs: "))
    if st.d2h_bytes_per_target_pass:  # a GPU's figure: on a CPU the outputs land in host memory
        t.add_row("device→host per target pass", f"{st.d2h_bytes_per_target_pass / 1e3:.1f} KB",
                  "hidden rows + logits (or their summary) copied from the GPU")
    console = Console(stderr=True)
    console.print(t)
    if lossy:
        console.print("[bold yellow]typical acceptance is LOSSY: this output is not distributed as the target's[/]")


DIFFERS_FROM_NONE = (
    "= none NO: a method's greedy tokens left plain decoding's on some prompt. On a quantized target that happens "
    "at near-ties: its int8/int4 kernels round a row by the rows beside it, so a verify pass over several rows and "
    "a one-row plain pass can differ in a last bit. `specrt verify` checks that each such difference is a near-tie "
    "(and passes it); --row-stable verifies chains one row at a time, equal to plain decoding bit for bit.")


def print_bench(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    cfg = result["config"]
    sampling = _sampling(cfg)
    t = Table(title=f"specrt bench · {cfg['prompts']} prompts × {cfg['max_new_tokens']} tokens · {sampling} · "
                    f"median of {cfg['repeats']} · {cfg['provider']}", title_justify="left")
    # Bytes from a GPU per target pass: a column only where outputs left device memory at all.
    d2h = any(r.get("d2h_bytes_per_target_pass") for r in result["methods"].values())
    greedy = result.get("greedy_baseline")
    for col in ("method", "tokens/s", "speedup", *(["vs greedy"] if greedy else []), "tokens/pass", "alpha",
                "c", "verify cost", "predicted", "draft/verify/other", "host ms/token",
                *(["D2H/pass"] if d2h else []), "= none"):
        t.add_column(col, justify="right")
    for method, r in result["methods"].items():
        split = f"{r['share_draft']:.0%}/{r['share_verify']:.0%}/{r['share_host']:.0%}"
        same = {True: "yes", False: "NO", None: "-"}[r.get("greedy_matches_none")]
        copied = [f"{r.get('d2h_bytes_per_target_pass', 0) / 1e3:.1f} KB"] if d2h else []
        vs_greedy = [f"{r['vs_greedy_none']:.2f}x"] if greedy else []
        t.add_row(method, f"{r['tokens_per_second']:.1f}", f"{r['speedup_vs_none']:.2f}x", *vs_greedy,
                  f"{r['tokens_per_target_pass']:.2f}", _fmt(r["alpha"]), _fmt(r["c"]), f"{r['verify_cost']:.2f}",
                  _fmt(r["predicted_speedup"], ".2f"), split, _fmt(r.get("host_ms_per_token"), ".3f"), *copied, same)
    import sys

    console = Console(width=None if sys.stdout.isatty() else 160)  # pipes and files get the whole table
    console.print(t)
    if greedy:
        none = result["methods"]["none"]
        console.print(f"vs greedy: each repeat's tokens/s over greedy plain decoding's, run beside it "
                      f"({greedy['tokens_per_second']:.1f} tokens/s); what sampling costs plain decoding: host "
                      f"{none['host_ms_per_token']:.3f} vs {greedy['host_ms_per_token']:.3f} ms/token, target "
                      f"pass {none['target_pass_ms']:.2f} vs {greedy['target_pass_ms']:.2f} ms")
    console.print(roofline_table(result))
    roof = result.get("roofline")
    if roof:
        console.print(f"roofline ({roof['device']}: read {roof['read_gbps']:.1f} GB/s): plain decoding reads "
                      f"{roof['plain_bytes_per_token'] / 1e6:.1f} MB per token, so at most "
                      f"{roof['plain_roofline_tokens_per_second']:.1f} tokens/s; measured "
                      f"{roof['plain_tokens_per_second']:.1f} "
                      f"({roof['plain_tokens_per_second'] / roof['plain_roofline_tokens_per_second']:.0%} of it)")
    for note in result.get("notes", []):
        console.print(f"note: {note}")
    if any(r.get("greedy_matches_none") is False for r in result["methods"].values()):
        console.print(DIFFERS_FROM_NONE)
    if "peers" in result:
        print_peers(result, console)


def roofline_table(result: dict):
    """Where the limit is, per method: bytes and passes per token, arithmetic against plain decoding, and
    (when measured) GB/s achieved, share of the roofline, the roofline's tokens/s, and energy per token."""
    from rich.table import Table

    rows = result["methods"]
    has_bw = "roofline" in result
    has_energy = any(r.get("joules_per_token") is not None for r in rows.values())
    t = Table(title="where the limit is · bytes read per generated token: weights + KV cache at the mean context",
              title_justify="left")
    cols = ["method", "MB/token", "target/draft passes per token", "context", "ops factor"]
    cols += ["GB/s", "% of roofline", "roofline tokens/s", "tokens/s"] if has_bw else []
    cols += ["J/token", "tokens/J"] if has_energy else []
    for col in cols:
        t.add_column(col, justify="right")
    for method, r in rows.items():
        cells = [method, f"{r['bytes_per_token'] / 1e6:.2f}",
                 f"{r['target_passes_per_token']:.2f} / {r['draft_passes_per_token']:.2f}",
                 f"{r['mean_context']:.0f}", _fmt(r.get("ops_factor"), ".2f") + ("x" if r.get("ops_factor") else "")]
        if has_bw:
            cells += [f"{r['achieved_gbps']:.1f}", f"{r['roofline_fraction']:.0%}",
                      f"{r['roofline_tokens_per_second']:.1f}", f"{r['tokens_per_second']:.1f}"]
        if has_energy:
            cells += [_fmt(r.get("joules_per_token"), ".4f"), _fmt(r.get("tokens_per_joule"), ".1f")]
        t.add_row(*cells)
    return t


def _sampling(s: dict) -> str:
    return ("greedy" if not s["temperature"] else f"T {s['temperature']}"
            + (f" top-k {s['top_k']}" if s.get("top_k") else "")
            + (f" top-p {s['top_p']}" if s.get("top_p", 1.0) < 1 else ""))


def print_peers(result: dict, console) -> None:
    """Each peer's tokens/s, every method's tokens/s over it, and whether the peer saw and made the same
    tokens; then the settings the peers ran."""
    from rich.table import Table

    pc = result["config"]["peers"]
    methods = list(result["methods"])
    t = Table(title="peers · same checkpoints, prompt ids, sampling", title_justify="left")
    for col in ("peer", "tokens/s", *(f"{m}/peer" for m in methods), "prompt ids = specrt's", "greedy = none",
                "tokens agreeing"):
        t.add_column(col, justify="right")
    for name, row in result["peers"].items():
        same, prefix = row.get("greedy_matches_none"), row.get("greedy_common_prefix")
        t.add_row(name, f"{row['tokens_per_second']:.1f}", *(f"{row['over_peer'][m]:.2f}x" for m in methods),
                  f"{row['prompt_ids_equal']:.0%}", "-" if same is None else f"{same:.0%}",
                  "-" if prefix is None else f"{prefix:.0%}")
    console.print(t)
    lines = [f"{name}: {row['description']}" + (f" · {row['note']}" if row.get("note") else "")
             + ((f" · from the cache (built in {row['build_seconds']:.0f} s)" if row["cached"]
                 else f" · built in {row['build_seconds']:.0f} s, cached in {row['model_dir']}")
                if "build_seconds" in row else "")
             for name, row in result["peers"].items()]
    seeds = pc["sampling"]["seeds"]
    lines.append(f"peers ran {_sampling(pc['sampling'])}"
                 + (f", seed {seeds[0]}" + (f"..{seeds[-1]} (one per repeat)" if len(seeds) > 1 else "")
                    if pc["sampling"]["temperature"] else "")
                 + f", from specrt's prompt ids; {pc['counting']}")
    if any(row.get("greedy_common_prefix") is not None for row in result["peers"].values()):
        lines.append("greedy = none: prompts whose tokens all equal specrt none's; tokens agreeing: the mean share "
                     "of each prompt's tokens before the first difference")
    if any(row["prompt_ids_equal"] < 1 for row in result["peers"].values()):
        lines.append("a peer's own tokenizer gives other prompt ids than specrt's for some prompts (column above)")
    console.print("\n".join(lines))


def print_plan(alpha: float, c: float, max_gamma: int = 16, mu: float | None = None,
               mu_note: str | None = None, verify_costs: tuple[float, ...] | None = None,
               measured_at: str | None = None, one_pass: bool = False) -> None:
    """``specrt plan``'s table (the optimal γ in bold green), the optimum, the oracle ceiling and where μ
    came from (``mu_note``; without μ, c stands in for it). ``measured_at``: the sampling α was measured at
    ("greedy", "T 0.7"), for the title. ``one_pass``: the drafter proposes γ tokens in one pass (DFlash)."""
    from rich.console import Console
    from rich.table import Table

    from .plan import oracle_line, plan_table, stand_in_note

    rows = plan_table(alpha, c, max_gamma, mu, verify_costs, one_pass)
    best = max(rows, key=lambda r: r.speedup)
    at = f" (measured {measured_at})" if measured_at else ""
    t = Table(title=f"α = {alpha:.3f}{at}, c = {c:.3f}, μ = {c if mu is None else mu:.4f}", title_justify="left")
    cost = ("c" if one_pass else "γc") + ("+1" if verify_costs is None else "+v(γ+1)")
    for col in ("γ", "E[tokens/pass]", f"cost {cost}", "speedup",
                "ops factor"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(str(r.gamma), f"{r.expected_tokens:.3f}", f"{r.relative_cost:.3f}", f"{r.speedup:.3f}x",
                  f"{r.ops_factor:.2f}x", style="bold green" if r is best else None)
    console = Console()
    console.print(t)
    for line in (f"optimal γ = {best.gamma}: {best.speedup:.2f}x over plain decoding"
                 + ("" if best.speedup > 1 else " — this draft cannot pay for itself")
                 + f", at {best.ops_factor:.2f}x its arithmetic",
                 oracle_line(alpha, best), mu_note if mu is not None else stand_in_note(c)):
        if line:
            console.out(line, highlight=False)
