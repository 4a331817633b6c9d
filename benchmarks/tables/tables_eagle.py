"""Tables of the EAGLE-3 studies: training runs and recipes, head variants, pruned heads, the head's graph, the
tree's depth, host work and calibration. Registered on import; tables.py imports this module.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from generated_blocks import table
from table_format import _md, _pct, _x


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


table("eagle-prune-bench-xeon-cpu", *(f"eagle/eagle-prune-bench-{n}-xeon-cpu.json" for n in ("16384", "4096", "2048")))(
    pruned_heads)
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


table("smollm2-eagle3-gqa-head-cpu", "eagle/smollm2-eagle3-gqa-head-cpu.json")(head_graphs)
@table("eagle-tree-depth-cpu", "eagle/eagle-tree-depth-cpu.json")
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


@table("eagle-train-speed-zen4-cpu", "eagle/eagle-train-speed-zen4-cpu.json")
def eagle_train_speed(data: dict) -> str:
    """benchmarks/eagle/eagle_train_speed.py: the target generating and one training step, float32 against bfloat16."""
    gen, step = data["generate_tokens_per_s"], data["step_s"]
    cfg = data["config"]
    return _md(["cost", "float32", "bfloat16", "bfloat16 vs float32"],
               [[f"generating, {cfg['rows']} rows (tokens/s)", f"{gen['float32']:.0f}", f"{gen['bfloat16']:.0f}",
                 _x(gen["bfloat16"] / gen["float32"])],
                [f"one training step, {cfg['batch_size']} × {cfg['seq_len']} tokens, TTT {cfg['ttt_steps']} (s)",
                 f"{step['float32']:.2f}", f"{step['bfloat16']:.2f}", _x(step["float32"] / step["bfloat16"])]])


@table("eagle-train-bf16-smollm2-cpu", "eagle/eagle-train-bf16-smollm2-cpu.json")
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


@table("eagle-variants-smollm2-cpu", "eagle/eagle-variants-smollm2-cpu.json")
def eagle_variants(data: dict) -> str:
    """benchmarks/eagle/eagle_variants.py: head variants trained from scratch on one cache, same batches and seed;
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


@table("eagle-self-prompts-smollm2-cpu", "eagle/eagle-train-r6-smollm2-cpu.json")
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


@table("eagle-mixed-prompts-smollm2-cpu", "eagle/eagle-train-r7-smollm2-cpu.json")
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


@table("eagle-stacked-smollm2-cpu", "eagle/eagle-stacked-smollm2-cpu.json")
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


@table("eagle-time-limit-smollm2-cpu", "eagle/eagle-time-limit-smollm2-cpu.json")
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


@table("tree-host-topk-cpu", "eagle/tree-host-topk-cpu.json")
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


@table("tree-calibration-xeon-cpu", "eagle/tree-calibration-xeon-cpu.json")
def tree_calibration(data: dict) -> str:
    """benchmarks/eagle/tree_calibration.py: per bundle, the tokens its head expected each tree to keep against those
    kept."""
    rows = []
    for r in data["runs"].values():
        cal = r["calibration"]
        rows.append([r["bundle"], f"{r['draft_vocab']:,}", str(cal["trees"]), f"{cal['nodes'] / cal['trees']:.2f}",
                     f"{cal['predicted_per_tree']:.3f}", f"{cal['kept_per_tree']:.3f}",
                     _x(cal["kept_per_tree"] / cal["predicted_per_tree"]), f"{r['tokens_per_target_pass']:.2f}"])
    return _md(["bundle", "draft ids", "trees", "nodes per tree", "tokens expected per tree", "tokens kept per tree",
                "kept / expected", "tokens per target pass"], rows)


@table("tree-calibration-bins-xeon-cpu", "eagle/tree-calibration-xeon-cpu.json")
def tree_calibration_bins(data: dict) -> str:
    """benchmarks/eagle/tree_calibration.py: the share of nodes kept per bin of the head's probability, per bundle."""
    runs = list(data["runs"].values())
    cells: dict[tuple[float, float], dict[str, str]] = {}
    for r in runs:
        for b in r["calibration"]["bins"]:
            cells.setdefault((b["low"], b["high"]), {})[r["bundle"]] = (
                f"{b['kept']:.2f} ({b['predicted']:.2f}, {b['nodes']})")
    rows = [[f"[{low:.2f}, {high:.2f}{']' if high == 1.0 else ')'}", *(row.get(r["bundle"], "–") for r in runs)]
            for (low, high), row in sorted(cells.items())]
    return _md(["head's probability of the node's path",
                *(f"{r['bundle']}: kept (mean probability, nodes)" for r in runs)], rows)
