"""Human-readable figures for the terminal (rich), kept out of the library's data classes."""

from __future__ import annotations

from .runtime.stats import GenerationStats


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def print_stats(st: GenerationStats, provider: str, lossy: bool = False,
                measured_speedup: float | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"specrt run · method {st.method} · {provider}", show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column(justify="right")
    t.add_column(style="dim")
    t.add_row("new tokens", str(st.new_tokens), f"{st.target_passes} target passes, {st.draft_passes} draft passes")
    t.add_row("tokens per target pass", _fmt(st.tokens_per_target_pass, ".2f"), "plain decoding = 1.00")
    if st.drafted:
        tree = st.method in ("tree", "medusa")
        t.add_row("acceptance (accepted/drafted)", _fmt(st.acceptance_rate), f"{st.accepted}/{st.drafted}"
                  + (" tree nodes" if tree else ""))
        if st.alpha_estimate is not None:
            t.add_row("alpha (mean sum min(p,q))", _fmt(st.alpha_estimate), "Leviathan et al.'s estimator")
        t.add_row("tree nodes per pass" if tree else "mean gamma", _fmt(st.mean_gamma, ".2f"), "")
        t.add_row("accepted per depth", "", " ".join(f"{x:.2f}" for x in st.accepted_per_depth[:8]))
        t.add_row("c (draft pass / target pass)", _fmt(st.c), "")
        if st.predicted_speedup is not None and not tree:
            t.add_row("predicted speedup", _fmt(st.predicted_speedup, ".2f") + "x",
                      "(1-a^(g+1))/(1-a) / (g c + 1); measure it with --method none")
    t.add_row("tokens/s", _fmt(st.tokens_per_second, ".1f"), f"{st.total_s * 1000:.0f} ms in all")
    if measured_speedup is not None:
        t.add_row("measured speedup", f"{measured_speedup:.2f}x", "vs --method none, same prompt and backend")
    t.add_row("time split", "", f"prefill {st.prefill_s * 1000:.0f} ms · draft {st.draft_s * 1000:.0f} ms · "
              f"verify {st.verify_s * 1000:.0f} ms · other {st.other_s * 1000:.0f} ms")
    t.add_row("host time per token", f"{st.host_ms_per_token:.3f} ms",
              f"outside the engines' forward calls; engines {st.engine_s * 1000:.0f} ms in all")
    t.add_row("device→host per target pass", f"{st.d2h_bytes_per_target_pass / 1e3:.1f} KB",
              "logits + hidden rows copied from the GPU (0 where outputs land in host memory)")
    console = Console(stderr=True)
    console.print(t)
    if lossy:
        console.print("[bold yellow]typical acceptance is LOSSY: this output is not distributed as the target's[/]")


def print_bench(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    cfg = result["config"]
    sampling = ("greedy" if not cfg["temperature"] else f"T {cfg['temperature']}"
                + (f" top-k {cfg['top_k']}" if cfg.get("top_k") else "")
                + (f" top-p {cfg['top_p']}" if cfg.get("top_p", 1.0) < 1 else ""))
    t = Table(title=f"specrt bench · {cfg['prompts']} prompts × {cfg['max_new_tokens']} tokens · {sampling} · "
                    f"median of {cfg['repeats']} · {cfg['provider']}", title_justify="left")
    for col in ("method", "tokens/s", "speedup", "tokens/pass", "alpha", "c", "verify cost", "predicted",
                "draft/verify/other", "host ms/token", "= none"):
        t.add_column(col, justify="right")
    for method, r in result["methods"].items():
        split = f"{r['share_draft']:.0%}/{r['share_verify']:.0%}/{r['share_host']:.0%}"
        same = {True: "yes", False: "NO", None: "-"}[r.get("greedy_matches_none")]
        t.add_row(method, f"{r['tokens_per_second']:.1f}", f"{r['speedup_vs_none']:.2f}x",
                  f"{r['tokens_per_target_pass']:.2f}", _fmt(r["alpha"]), _fmt(r["c"]), f"{r['verify_cost']:.2f}",
                  _fmt(r["predicted_speedup"], ".2f"), split, _fmt(r.get("host_ms_per_token"), ".3f"), same)
    import sys

    console = Console(width=None if sys.stdout.isatty() else 140)  # pipes and files get the whole table
    console.print(t)
    if "hf" in result:
        hf = result["hf"]
        lines = [f"Hugging Face generate: {hf['hf_generate']['tokens_per_second']:.1f} tokens/s "
                 f"(specrt none is {hf['specrt_none_over_hf_generate']:.2f}x)"]
        if "hf_assisted" in hf:
            lines.append(f"Hugging Face assisted generation: {hf['hf_assisted']['tokens_per_second']:.1f} tokens/s"
                         + (f" (specrt draft is {hf['specrt_draft_over_hf_assisted']:.2f}x)"
                            if "specrt_draft_over_hf_assisted" in hf else ""))
        console.print("\n".join(lines))
