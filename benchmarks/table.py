"""Markdown table of a `specrt bench --json` file, as docs/demo.md and the README show it.

    python benchmarks/table.py benchmarks/demo-cpu.json
"""

from __future__ import annotations

import json
import sys


def _f(value, fmt: str, missing: str = "–") -> str:
    return missing if value is None else format(value, fmt)


def _x(value) -> str:
    return "–" if value is None else f"{value:.2f}×"


def table(data: dict) -> str:
    cfg = data["config"]
    rows = ["| method | tokens/s | speedup | tokens / target pass | α (Σmin) | accepted / drafted | c | verify cost "
            "| predicted (theory) | predicted with verify cost | greedy = none |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, m in data["methods"].items():
        label = {"draft": f"draft (γ = {cfg['gamma']})",
                 "tree": f"tree ({','.join(map(str, cfg['tree']))})"}.get(name, name)
        rows.append(" | ".join([
            f"| {label}", _f(m["tokens_per_second"], ".0f"), f"{m['speedup_vs_none']:.2f}×",
            _f(m["tokens_per_target_pass"], ".2f"), _f(m["alpha"], ".2f"), _f(m["acceptance_rate"], ".2f"),
            _f(m["c"] if name not in ("none", "medusa") else None, ".3f"),  # heads' cost is inside verify
            _f(m["verify_cost"], ".2f"),
            _x(m.get("predicted_speedup")), _x(m.get("predicted_with_verify_cost")),
            "yes" if m["greedy_matches_none"] else "NO"]) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table(json.loads(open(sys.argv[1]).read())))
