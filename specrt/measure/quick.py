"""What a bundle gains here, read in seconds: ``auto`` against plain decoding on a few prompts, greedy and sampled.

``specrt export`` ends with it, so a user learns what the bundle does on this machine before deciding what to do
next. A rough reading (a few prompts, interleaved per prompt so a drifting machine affects both alike); ``specrt
bench`` gives a real one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from ..bundle.machine import cpu_name
from ..bundle.manifest import Manifest
from ..runtime.drafters import auto_candidates
from ..runtime.generator import SpeculativeGenerator
from ..runtime.stats import GenerationStats
from .bench import encode

QUICK_TEMPERATURES = (0.0, 0.7)  # greedy, and a chat app's usual sampling


@dataclass(frozen=True)
class QuickReading:
    """``auto`` over plain decoding at one temperature: tokens/s of each over the same prompts and seeds."""

    temperature: float
    method: str  # what auto ran
    auto_tps: float
    none_tps: float
    plain_steps: float  # share of auto's steps that its switch gave to plain decoding

    @property
    def speedup(self) -> float:
        return self.auto_tps / self.none_tps if self.none_tps else 0.0


def quick_speedup(gen: SpeculativeGenerator, prompts: Sequence[str], chat: bool, max_new_tokens: int = 48,
                  temperatures: Sequence[float] = QUICK_TEMPERATURES,
                  on_progress: Callable[[str], None] | None = None) -> list[QuickReading]:
    """``auto`` and ``none`` on every prompt at each temperature, in turn per prompt (which goes first
    alternates), after a warm-up; the verify-cost curve a method reads is measured before anything is timed."""
    ids = [encode(gen, p, chat) for p in prompts]
    gen.stream_ids(ids[0], max_new_tokens=8, method="none").result  # first-call allocations
    gen.verify_costs()
    readings = []
    for t in temperatures:
        if on_progress:
            on_progress(f"timing auto against plain decoding, {'greedy' if t == 0 else f'T {t}'}")
        runs: dict[str, list[GenerationStats]] = {"auto": [], "none": []}
        for i, prompt in enumerate(ids):
            for method in ("none", "auto") if i % 2 == 0 else ("auto", "none"):
                result = gen.stream_ids(prompt, max_new_tokens=max_new_tokens, method=method, temperature=t, seed=i)
                runs[method].append(result.result.stats)
        auto = runs["auto"]
        steps = sum(s.target_passes - 1 for s in auto)
        readings.append(QuickReading(t, auto[0].method, _tps(auto), _tps(runs["none"]),
                                     sum(s.paused_steps for s in auto) / steps if steps else 0.0))
    return readings


def fastest_method(gen: SpeculativeGenerator, prompts: Sequence[str], chat: bool, methods: Sequence[str],
                   max_new_tokens: int = 48, temperatures: Sequence[float] = QUICK_TEMPERATURES,
                   on_progress: Callable[[str], None] | None = None) -> dict:
    """``auto``'s choice among a bundle's drafters, measured here: each of ``methods`` on the same prompts and seeds
    at each temperature, in turn per prompt (which goes first rotates, so a drifting machine affects all alike),
    after a warm-up that also loads each drafter. What ``specrt export`` keeps as ``Manifest.chosen["auto"]``: the
    method whose tokens/s has the highest geometric mean over the temperatures, every method's tokens/s, and what
    was run where."""
    ids = [encode(gen, p, chat) for p in prompts]
    for method in methods:  # first-call allocations; a head or a DFlash draft is loaded on first use
        gen.stream_ids(ids[0], max_new_tokens=8, method=method).result
    gen.verify_costs()
    rates: dict[str, list[float]] = {m: [] for m in methods}
    for t in temperatures:
        if on_progress:
            on_progress(f"timing {', '.join(methods)}, {'greedy' if t == 0 else f'T {t}'}")
        runs: dict[str, list[GenerationStats]] = {m: [] for m in methods}
        for i, prompt in enumerate(ids):
            for method in list(methods[i % len(methods):]) + list(methods[:i % len(methods)]):
                result = gen.stream_ids(prompt, max_new_tokens=max_new_tokens, method=method, temperature=t, seed=i)
                runs[method].append(result.result.stats)
        for method in methods:
            rates[method].append(_tps(runs[method]))
    score = {m: math.prod(r) ** (1 / len(r)) if all(r) else 0.0 for m, r in rates.items()}
    return {"method": max(methods, key=lambda m: score[m]), "machine": cpu_name(),
            "tokens_per_s": {m: {f"{t:g}": round(v, 1) for t, v in zip(temperatures, r)} for m, r in rates.items()},
            "measured": f"{len(ids)} prompts x {max_new_tokens} tokens, greedy and sampled, one process"}


def choose_drafter(folder: str | Path, manifest: Manifest, prompts: Sequence[str], chat: bool,
                   max_new_tokens: int = 48, on_progress: Callable[[str], None] | None = None) -> Manifest:
    """``manifest`` (of the bundle in ``folder``) with :func:`fastest_method`'s record as ``chosen["auto"]``, written,
    where the bundle holds more than one drafter; else as it was."""
    methods = auto_candidates(manifest)
    if len(methods) < 2:
        return manifest
    record = fastest_method(SpeculativeGenerator(folder), prompts, chat, methods, max_new_tokens,
                            on_progress=on_progress)
    manifest = replace(manifest, chosen={**manifest.chosen, "auto": record})
    manifest.write(Path(folder))
    return manifest


def describe_choice(record: dict) -> str:
    """One line: which drafter auto runs and what each measured."""
    rates = "; ".join(f"{m} " + ", ".join(f"{v:.0f}" for v in by_t.values())
                      for m, by_t in record["tokens_per_s"].items())
    temps = ", ".join("greedy" if t == "0" else f"T {t}" for t in next(iter(record["tokens_per_s"].values())))
    return f"auto will run {record['method']}, the fastest drafter measured here (tokens/s at {temps}: {rates})"


def _tps(stats: list[GenerationStats]) -> float:
    seconds = sum(s.total_s for s in stats)
    return sum(s.new_tokens for s in stats) / seconds if seconds else 0.0


def describe_readings(readings: Sequence[QuickReading], prompts: int, max_new_tokens: int, folder: str) -> str:
    """One line: what auto gained at each temperature, and where a real measurement is."""
    parts = []
    for r in readings:
        at = "greedy" if r.temperature == 0 else f"at T {r.temperature:g}"
        ran = f", plain steps {100 * r.plain_steps:.0f} % of the time" if r.plain_steps >= 0.05 else ""
        parts.append(f"{r.speedup:.2f}x {at}{ran}")
    method = readings[0].method if readings else "auto"
    return (f"measured here: auto ({method}) ran {'; '.join(parts)}, against plain decoding ({prompts} prompts x "
            f"{max_new_tokens} tokens, a rough reading; specrt bench --bundle {folder} for a real one)")
