"""Every measurement table in README.md and docs/, rendered from the JSON in benchmarks/.

    python benchmarks/tables/tables.py --write        # rewrite every generated block in README.md and docs/**/*.md
    python benchmarks/tables/tables.py --check        # exit 1, naming each block that differs from its JSON
    python benchmarks/tables/tables.py NAME           # print one table (--list: every name)
    python benchmarks/tables/tables.py FILE.json      # a `specrt bench --json` file as the full bench table

The generated blocks themselves (the registry, check, rewrite) are in generated_blocks.py. Each table is a pure
function of the JSON file(s) it is registered with, named by their path under benchmarks/ (the topic folder
they sit in: `demo/demo-cpu.json`); nothing here measures anything.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # generated_blocks.py, beside this file
# FIX and blocks: the tests read them here
from generated_blocks import FIX, ROOT, TABLES, blocks, check, render, table, write  # noqa: E402,F401
from table_format import DTYPE, _f, _md, _pct, _x, _yes  # noqa: E402
import tables_studies  # noqa: E402,F401  (registers the studies' tables)
import tables_scale  # noqa: E402,F401  (registers the scale studies' tables)
import tables_eagle  # noqa: E402,F401  (registers the EAGLE studies' tables)


# ---- `specrt bench --json` files (demo-cpu, demo-int4-cpu) -------------------------------------------------

def headline(data: dict) -> str:
    """The README's table: ≤ 7 columns."""
    return _md(["method", "tokens/s", "speedup vs none", "tokens per target pass", "α", "predicted (theory)",
                "predicted with verify cost"],
               [[name, _f(m["tokens_per_second"], ".0f"), _x(m["speedup_vs_none"]),
                 _f(m["tokens_per_target_pass"], ".2f"), _f(m["alpha"], ".2f"), _x(m.get("predicted_speedup")),
                 _x(m.get("predicted_with_verify_cost"))] for name, m in data["methods"].items()])


def bench_table(data: dict) -> str:
    """Every column `specrt bench` reports per method (what benchmarks/tables/table.py printed)."""
    cfg = data["config"]
    greedy = cfg["temperature"] == 0
    rows = []
    for name, m in data["methods"].items():
        label = {"draft": f"draft (γ = {cfg['gamma']})", "eagle": f"eagle (γ = {cfg['gamma']})",
                 "dflash": f"dflash (γ = {cfg['gamma']})",
                 "eagle-tree": f"eagle-tree ({cfg.get('eagle_tree')})",
                 "tree": f"tree ({','.join(map(str, cfg['tree']))})"}.get(name, name)
        base, at, gamma = name.partition("@")  # bench's NAME@GAMMA: one entry's own γ
        if at:
            label = f"{base} (γ auto: mean {m['mean_gamma']:.2f})" if gamma == "auto" else f"{base} (γ = {gamma})"
        rows.append([label, _f(m["tokens_per_second"], ".0f"), _x(m["speedup_vs_none"]),
                     _f(m["tokens_per_target_pass"], ".2f"), _f(m["alpha"], ".2f"), _f(m["acceptance_rate"], ".2f"),
                     _f(m["c"] if name not in ("none", "medusa") else None, ".3f"),  # heads' cost is inside verify
                     _f(m["verify_cost"], ".2f"), _x(m.get("predicted_speedup")),
                     _x(m.get("predicted_with_verify_cost")),
                     ("yes" if m["greedy_matches_none"] else "NO") if greedy else _x(m.get("vs_greedy_none"))])
    return _md(["method", "tokens/s", "speedup", "tokens / target pass", "α (Σmin)", "accepted / drafted", "c",
                "verify cost", "predicted (theory)", "predicted with verify cost",
                "greedy = none" if greedy else "vs greedy none"], rows)


def roofline(data: dict) -> str:
    """`bench --roofline`'s second table: bytes per token, passes, ops factor, share of the probed bandwidth."""
    gbps = data["roofline"]["read_gbps"]
    return _md(["method", "bytes read per token", "target / draft passes per token", "ops factor", "GB/s achieved",
                f"share of the roofline ({gbps:.1f} GB/s read)", "roofline tokens/s"],
               [[name, f"{m['bytes_per_token'] / 1e6:.1f} MB",
                 f"{m['target_passes_per_token']:.2f} / {m['draft_passes_per_token']:.2f}", _x(m["ops_factor"]),
                 _f(m["achieved_gbps"], ".1f"), _pct(m["roofline_fraction"]),
                 _f(m["roofline_tokens_per_second"], ".0f")] for name, m in data["methods"].items()])


PEER_LABEL = {"hf_generate": "Hugging Face `generate` ({dtype})",
              "hf_assisted": "Hugging Face assisted generation ({dtype}, the same draft)",
              "ortgenai": "ONNX Runtime GenAI (its own builder; {precision})",
              "llamacpp": "llama.cpp plain (the same GGUF)",
              "llamacpp-lookup": "llama.cpp prompt lookup (the same GGUF, {lookup_tokens} tokens)"}


def peers(data: dict) -> str:
    """Each peer of `bench --compare`, interleaved in the same run on the same checkpoints."""
    prompts, rows = data["config"]["prompts"], []
    for name, p in data["peers"].items():
        label = PEER_LABEL.get(name, p.get("description", name)).format(**{**p, "dtype": DTYPE.get(p.get("dtype"))})
        if p.get("bundle_precision") not in (None, p.get("precision")):
            label = label[:-1] + f", the bundle is {p['bundle_precision']})"
        rows.append([label, _f(p["tokens_per_second"], ".0f"), _x(p["over_peer"]["none"]),
                     _x(p["over_peer"].get("draft")), f"{round(p['greedy_matches_none'] * prompts)} of {prompts}"])
    return _md(["peer (plain decoding unless said)", "tokens/s", "specrt `none` / peer", "specrt `draft` / peer",
                "prompts with specrt's greedy tokens"], rows)


def versus_peer(data: dict) -> str:
    """Each method against specrt none and against one peer's plain decoding (demo-int4-cpu)."""
    (peer,) = data["peers"].values()
    gamma, rows = data["config"]["gamma"], []
    for name, m in data["methods"].items():
        detail = {"draft": [f"γ {gamma}; α {_f(m['alpha'], '.3f')}"], "ngram": ["prompt lookup"]}.get(name, [])
        if name != "none":
            detail.append(f"{m['tokens_per_target_pass']:.2f} tokens per pass")
        label = f"{name} ({', '.join(detail)})" if detail else name
        rows.append([label, _f(m["tokens_per_second"], ".0f"), _x(m["speedup_vs_none"]),
                     _x(peer["over_peer"][name]), _yes(m["greedy_matches_none"])])
    return _md(["method", "tokens/s", "vs specrt none",
                f"vs ONNX Runtime GenAI {peer['precision']} plain ({peer['tokens_per_second']:.0f} tokens/s)",
                "greedy = none"], rows)


def one_run(data: dict) -> str:
    """specrt's methods and every peer of `bench --compare` from one run: tokens/s, each against specrt none,
    and how far each peer's greedy tokens agree with none's."""
    none, prompts, rows = data["methods"]["none"]["tokens_per_second"], data["config"]["prompts"], []
    for name, m in data["methods"].items():
        label = f"specrt `{name}`" + (f" ({m['tokens_per_target_pass']:.2f} tokens per pass)" if name != "none" else "")
        rows.append([label, _f(m["tokens_per_second"], ".0f"), _x(m["speedup_vs_none"]),
                     "all" if m.get("greedy_matches_none") else "not all (near-ties)", "–"])
    for name, p in data["peers"].items():
        label = PEER_LABEL.get(name, p.get("description", name)).format(**p)
        rows.append([label, _f(p["tokens_per_second"], ".0f"), _x(p["tokens_per_second"] / none),
                     f"{round(p['greedy_matches_none'] * prompts)} of {prompts}",
                     _pct(p.get("greedy_common_prefix"))])
    return _md(["engine and method (one process, interleaved)", "tokens/s", "vs specrt `none`",
                "prompts with `none`'s greedy tokens", "tokens before the first difference"], rows)


table("demo-cpu", "demo/demo-cpu.json")(headline)
table("demo-cpu-full", "demo/demo-cpu.json")(bench_table)
table("demo-cpu-roofline", "demo/demo-cpu.json")(roofline)
table("demo-cpu-peers", "demo/demo-cpu.json")(peers)
table("demo-int4-cpu", "demo/demo-int4-cpu.json")(versus_peer)
table("demo-int4-cpu-full", "demo/demo-int4-cpu.json")(bench_table)
table("demo-int4-cpu-roofline", "demo/demo-int4-cpu.json")(roofline)
table("demo-int4-gqa-cpu", "demo/demo-int4-gqa-cpu.json")(versus_peer)
table("demo-int4-genai-threads-cpu", "demo/demo-int4-genai-threads-cpu.json")(versus_peer)
table("smollm2-eagle-cpu", "eagle/smollm2-eagle-cpu.json")(bench_table)
table("smollm2-eagle3-cpu", "eagle/smollm2-eagle3-cpu.json")(bench_table)
table("smollm2-eagle3-int8-cpu", "eagle/smollm2-eagle3-int8-cpu.json")(bench_table)
table("smollm2-eagle3-t07-cpu", "eagle/smollm2-eagle3-t07-cpu.json")(bench_table)
table("smollm2-eagle3-qhead-cpu", "eagle/smollm2-eagle3-qhead-cpu.json")(bench_table)
table("smollm2-eagle3-int8-qhead-cpu", "eagle/smollm2-eagle3-int8-qhead-cpu.json")(bench_table)
table("smollm2-eagle3-qhead-t07-cpu", "eagle/smollm2-eagle3-qhead-t07-cpu.json")(bench_table)
table("demo-eagle3-cpu", "eagle/demo-eagle3-cpu.json")(bench_table)
table("smollm2-self-draft-cpu", "eagle/smollm2-self-draft-cpu.json")(bench_table)
table("smollm2-eagle3-int8-qhead-g2-cpu", "eagle/smollm2-eagle3-int8-qhead-g2-cpu.json")(bench_table)
table("smollm2-eagle3-r2-cpu", "eagle/smollm2-eagle3-r2-cpu.json")(bench_table)
table("smollm2-eagle3-r2-int8-cpu", "eagle/smollm2-eagle3-r2-int8-cpu.json")(bench_table)
table("smollm2-eagle3-r2-t07-cpu", "eagle/smollm2-eagle3-r2-t07-cpu.json")(bench_table)
table("smollm2-gguf-q41-eagle3-cpu", "side-by-side/smollm2-gguf-q41-eagle3-cpu.json")(bench_table)
table("smollm2-compare-cpu", "side-by-side/smollm2-compare-cpu.json")(one_run)
table("smollm2-gguf-head-t07-cpu", "side-by-side/smollm2-gguf-head-t07-cpu.json")(bench_table)
table("smollm2-gguf-nohead-auto-t07-cpu", "side-by-side/smollm2-gguf-nohead-auto-t07-cpu.json")(bench_table)
for _name in ("demo-dflash-cpu", "demo-dflash-t07-cpu", "smollm2-dflash-q41-cpu", "smollm2-dflash-q41-t07-cpu",
              "smollm2-dflash-int4-cpu", "smollm2-dflash-fp32-cpu", "smollm2-dflash-int4-qdraft-cpu",
              "smollm2-dflash-int4-fdraft-cpu", "smollm2-dflash-q41-int8draft-cpu", "demo-dflash-code-cpu",
              "demo-dflash-code-t07-cpu"):
    table(_name, f"dflash/{_name}.json")(bench_table)
table("smollm2-gguf-nohead-auto-t1-cpu", "side-by-side/smollm2-gguf-nohead-auto-t1-cpu.json")(bench_table)
table("smollm2-eagle3-r3-cpu", "eagle/smollm2-eagle3-r3-cpu.json")(bench_table)
table("smollm2-eagle3-r3-int8-cpu", "eagle/smollm2-eagle3-r3-int8-cpu.json")(bench_table)
table("smollm2-eagle3-r3-gqa-cpu", "eagle/smollm2-eagle3-r3-gqa-cpu.json")(bench_table)
table("smollm2-eagle3-r4-cpu", "eagle/smollm2-eagle3-r4-cpu.json")(bench_table)
table("smollm2-eagle-tree-auto-cpu", "eagle/smollm2-eagle-tree-auto-cpu.json")(bench_table)
table("smollm2-eagle3-r4-int8-cpu", "eagle/smollm2-eagle3-r4-int8-cpu.json")(bench_table)
table("smollm2-eagle3-r4-t07-cpu", "eagle/smollm2-eagle3-r4-t07-cpu.json")(bench_table)
table("smollm2-eagle3-auto-gamma-cpu", "eagle/smollm2-eagle3-auto-gamma-cpu.json")(bench_table)
table("smollm2-eagle3-auto-gamma-int8-cpu", "eagle/smollm2-eagle3-auto-gamma-int8-cpu.json")(bench_table)
table("smollm2-eagle3-auto-gamma-t07-cpu", "eagle/smollm2-eagle3-auto-gamma-t07-cpu.json")(bench_table)
table("smollm2-eagle-tree-t07-fp32-cpu", "eagle/smollm2-eagle-tree-t07-fp32-cpu.json")(bench_table)
table("smollm2-eagle-tree-t07-int8-cpu", "eagle/smollm2-eagle-tree-t07-int8-cpu.json")(bench_table)
table("smollm2-int8-integer-bench-xeon-cpu", "integer-kernel/smollm2-int8-integer-bench-xeon-cpu.json")(bench_table)
table("smollm2-t07-r8-i8-xeon-cpu", "integer-kernel/smollm2-t07-r8-i8-xeon-cpu.json")(bench_table)
table("smollm2-eagle-zen4-fp32-cpu", "eagle/smollm2-eagle-zen4-fp32-cpu.json")(bench_table)
table("smollm2-eagle-zen4-t07-cpu", "eagle/smollm2-eagle-zen4-t07-cpu.json")(bench_table)
table("smollm2-eagle-h200", "gpu/smollm2-eagle-h200.json")(bench_table)
table("smollm2-eagle-t07-h200", "gpu/smollm2-eagle-t07-h200.json")(bench_table)
table("smollm2-eagle-zen4-int8-cpu", "eagle/smollm2-eagle-zen4-int8-cpu.json")(bench_table)
table("smollm2-t07-r8-int8-xeon-cpu", "integer-kernel/smollm2-t07-r8-int8-xeon-cpu.json")(bench_table)


def main(argv: list[str]) -> int:
    if argv == ["--check"]:
        problems = check()
        print("\n".join(problems) if problems else "every generated block matches benchmarks/*/*.json",
              file=sys.stderr if problems else sys.stdout)
        return 1 if problems else 0
    if argv == ["--write"]:
        for path in write():
            print(f"rewrote {path.relative_to(ROOT)}")
        return 0
    if argv == ["--list"]:
        print("\n".join(f"{name}\t{', '.join(files)}" for name, (files, _) in TABLES.items()))
        return 0
    if len(argv) == 1 and argv[0] in TABLES:
        print(render(argv[0]))
        return 0
    if len(argv) == 1 and argv[0].endswith(".json"):
        print(bench_table(json.loads(Path(argv[0]).read_text())))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
