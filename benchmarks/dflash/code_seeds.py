"""The code seed prompts the demo target's DFlash draft was trained on (benchmarks/prompts/demo-code-seeds.json).

The demo target learned Python's standard library (specrt.export.demo.corpus). Each seed is one function's ``def``
line and its docstring's first line, from the corpus's training split, in a fixed shuffled file order; specrt's shipped
prompts (what `specrt bench` decodes) are left out.

    python benchmarks/dflash/code_seeds.py benchmarks/prompts/demo-code-seeds.json
"""

from __future__ import annotations

import json
import random
import re
import sys

from specrt.data import prompts
from specrt.export.demo.corpus import read_text, select

DEF = re.compile(r"^(\s*)def \w+\(.*\):\s*$")


def code_seeds(limit: int = 400, seed: int = 0) -> list[str]:
    """Up to ``limit`` seeds, the first function with a docstring of each training file."""
    shipped = set(prompts("all"))
    files = select("train")
    random.Random(seed).shuffle(files)
    out: list[str] = []
    for f in files:
        lines = read_text(f).splitlines()
        for i, line in enumerate(lines):
            m = DEF.match(line)
            if m and i + 1 < len(lines) and '"""' in lines[i + 1]:
                text = "\n".join(lines[i:i + 2]) + "\n" + m.group(1) + "    "
                if text not in shipped:
                    out.append(text)
                break
        if len(out) >= limit:
            break
    return out


if __name__ == "__main__":
    with open(sys.argv[1], "w") as fh:
        json.dump(code_seeds(), fh, indent=0)
