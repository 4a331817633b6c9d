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
    per row count (after one untimed), over the 1-row figure. Leaves the model's cache empty."""
    greedy = SamplingConfig()
    max_rows = max(1, min(max_rows, model.cache.max_context - 1))
    context = max(1, min(context, model.cache.max_context - max_rows))
    model.reset()
    model.feed([0] * context, greedy)
    times = []
    for rows in range(1, max_rows + 1):
        best = float("inf")
        for i in range(repeats + 1):
            before = model.forward_s
            model.feed([0] * rows, greedy, last=rows)
            model.cache.truncate(context)
            if i:
                best = min(best, model.forward_s - before)
        times.append(best)
    model.reset()
    return theory.verify_costs_from_times(times)
