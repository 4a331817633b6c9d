"""export's last line (measure.quick): auto against plain decoding on a few prompts, greedy and sampled."""

from __future__ import annotations

import specrt
from specrt.measure.quick import QuickReading, describe_readings, quick_speedup


def test_quick_reading_times_auto_and_plain_on_the_same_prompts(close_bundle):
    gen = specrt.load(close_bundle, threads=1)
    said = []
    readings = quick_speedup(gen, ["def f(x):", "import os"], chat=False, max_new_tokens=16, on_progress=said.append)
    assert [r.temperature for r in readings] == [0.0, 0.7] and len(said) == 2
    assert all(r.method == "draft" and r.auto_tps > 0 and r.none_tps > 0 and 0 <= r.plain_steps <= 1
               for r in readings)


def test_the_line_says_each_gain_and_where_auto_switched_to_plain_steps():
    line = describe_readings([QuickReading(0.0, "eagle-tree", 120.0, 100.0, 0.01),
                              QuickReading(0.7, "eagle-tree", 99.0, 100.0, 0.8)], 4, 48, "b")
    assert line.startswith("measured here: auto (eagle-tree) ran 1.20x greedy; 0.99x at T 0.7, plain steps 80 % of")
    assert "(4 prompts x 48 tokens" in line and "specrt bench --bundle b" in line
