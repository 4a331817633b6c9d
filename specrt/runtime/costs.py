"""What a target pass over r rows costs against one row on this backend: the verify-cost curve ``--gamma auto``
weighs γ with (theory.verify_cost_at). Measured once per loaded bundle, engine time only, a fraction of a
second on a CPU model (docs/methods.md)."""

from __future__ import annotations

from .. import theory
from .cached import CachedModel
from .sampling import SamplingConfig

CALIBRATION_ROWS = 9  # γ ≤ 8 measured; longer chains extrapolate (theory.verify_cost_at)
MEASURED_TREE_ROWS = 33  # a tree sized by cost: its passes measured up to here (beyond: extrapolated)
CALIBRATION_CONTEXT = 32


def measure_verify_costs(model: CachedModel, max_rows: int = CALIBRATION_ROWS, context: int = CALIBRATION_CONTEXT,
                         repeats: int = 3) -> tuple[float, ...]:
    """v(1..max_rows) of ``model`` over ``context`` cached positions: the fastest of ``repeats`` timed passes
    per row count (after one untimed round), over the 1-row figure. Rounds sweep every row count in turn, so
    a slow spell of the machine lands on all counts alike, not on a run of neighbours: on a noisy 2-core VM
    three sweeps of v(1..28) agreed within 0.16 at 28 rows, three per-count blocks within 0.56. Leaves the
    model's cache empty."""
    greedy = SamplingConfig()
    max_rows = max(1, min(max_rows, model.cache.max_context - 1))
    context = max(1, min(context, model.cache.max_context - max_rows))
    model.reset()
    model.feed([0] * context, greedy)
    times = [float("inf")] * max_rows
    for sweep in range(repeats + 1):
        for rows in range(1, max_rows + 1):
            before = model.forward_s
            model.feed([0] * rows, greedy, last=rows)
            model.cache.truncate(context)
            if sweep:
                times[rows - 1] = min(times[rows - 1], model.forward_s - before)
    model.reset()
    return theory.verify_costs_from_times(times)
