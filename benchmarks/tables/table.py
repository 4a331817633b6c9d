"""Markdown table of a `specrt bench --json` file (every column); the tables now live in tables.py.

    python benchmarks/tables/table.py benchmarks/demo/demo-cpu.json
    # = python benchmarks/tables/tables.py benchmarks/demo/demo-cpu.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tables import bench_table as table

if __name__ == "__main__":
    print(table(json.loads(Path(sys.argv[1]).read_text())))
