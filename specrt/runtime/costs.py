"""What a target pass over r rows costs against one row on this backend: the verify-cost curve ``--gamma auto``
weighs γ with (theory.verify_cost_at) and an ``auto``-sized tree its nodes. Engine time only: a fraction of a
second on a small CPU model, ~1 s for the default tree's 22 rows on SmolLM2-135M at int8, so the curve is kept in
specrt's per-user cache and measured once per graph, backend and machine (docs/methods.md)."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import numpy as np

from .. import theory
from ..bundle.safety import write_atomic
from .cached import CachedModel
from .sampling import SamplingConfig

CALIBRATION_ROWS = 9  # γ ≤ 8 measured; longer chains extrapolate (theory.verify_cost_at)
MEASURED_TREE_ROWS = 33  # a tree sized by cost: its passes measured up to here (beyond: extrapolated)
CALIBRATION_CONTEXT = 32
CURVES_FOLDER = "verify-costs"  # in specrt's per-user cache: one JSON file per kept curve
TREE_ROWS_TIMED = (12, 16, 22, 28)  # past CALIBRATION_ROWS a curve is timed here (and at its end), lines between


def timed_rows(max_rows: int) -> list[int]:
    """The row counts a curve up to ``max_rows`` is timed at: each up to CALIBRATION_ROWS (a chain's γ + 1, and
    where a small tree's passes fall), then a few to its end. A pass costs about the same again per row beyond
    (docs/performance/verify-cost-cpu.md), so the line between two timed counts stands for those between, and
    the default tree's 22-row curve takes 12 timed counts a sweep instead of 22."""
    return sorted({*range(1, min(max_rows, CALIBRATION_ROWS) + 1), *(r for r in TREE_ROWS_TIMED if r < max_rows),
                   max_rows})


def measure_verify_costs(model: CachedModel, max_rows: int = CALIBRATION_ROWS, context: int = CALIBRATION_CONTEXT,
                         repeats: int = 3) -> tuple[float, ...]:
    """v(1..max_rows) of ``model`` over ``context`` cached positions: the fastest of ``repeats`` timed passes
    per row count of :func:`timed_rows` (after one untimed round; counts between them interpolated), over the
    1-row figure. Rounds sweep every row count in turn, so a slow spell of the machine lands on all counts alike,
    not on a run of neighbours: on a noisy 2-core VM three sweeps of v(1..28) agreed within 0.16 at 28 rows,
    three per-count blocks within 0.56. Leaves the model's cache empty."""
    greedy = SamplingConfig()
    max_rows = max(1, min(max_rows, model.cache.max_context - 1))
    context = max(1, min(context, model.cache.max_context - max_rows))
    counts = timed_rows(max_rows)
    model.reset()
    model.feed([0] * context, greedy)
    times = [float("inf")] * len(counts)
    for sweep in range(repeats + 1):
        for i, rows in enumerate(counts):
            before = model.forward_s
            model.feed([0] * rows, greedy, last=rows)
            model.cache.truncate(context)
            if sweep:
                times[i] = min(times[i], model.forward_s - before)
    model.reset()
    return theory.verify_costs_from_times(np.interp(np.arange(1, max_rows + 1), counts, times).tolist())


def remembered_verify_costs(model: CachedModel, key: dict, max_rows: int, folder: Path) -> tuple[float, ...]:
    """:func:`measure_verify_costs` kept in ``folder``, one file per ``key`` (what the curve depends on: the
    graph's file, the backend, its threads, the machine; JSON values). Measured when no curve of at least
    ``max_rows`` is kept under the key (or its file is unreadable), then written for the next process; a folder
    that cannot be written only costs that process the measurement again."""
    text = json.dumps(key, sort_keys=True)
    key = json.loads(text)  # as it reads back from the file (tuples as lists)
    path = folder / CURVES_FOLDER / f"{hashlib.sha256(text.encode()).hexdigest()[:24]}.json"
    try:
        kept = json.loads(path.read_text())
        if kept["key"] == key and len(kept["costs"]) >= max_rows:
            return tuple(float(v) for v in kept["costs"][:max_rows])
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none kept, or not readable as one: measure
    costs = measure_verify_costs(model, max_rows=max_rows)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps({"key": key, "costs": list(costs),
                                       "measured": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, indent=1) + "\n")
    except OSError:
        pass
    return costs
