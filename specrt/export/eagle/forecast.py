"""What an EAGLE-3 training run (:mod:`.train`) can be expected to give, said before and after it trains: the least
time a ``--time-limit`` run needs (a limit below it is refused before anything is generated), an estimate of the
run's length and of the head's held-out acceptance before training, and after it whether the head drafts well
enough to pay for itself, and what more data or time would give.

The acceptance figures are a rough guide: first-draft acceptance against the token rows the head trained on,
interpolated between SmolLM2-135M-Instruct runs on a CPU (``ANCHORS``, docs/performance/smollm2-eagle3-cpu.md).
Other targets, data and settings land elsewhere; the measured held-out acceptance after training is the figure to
trust, and the warning after training reads that one."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ...errors import ConfigError
from ...theory import expected_tokens, speedup
from . import budget
from .train_config import EagleTrainConfig

# Reading the target, as a floor before it is read (a time limit counts it): bytes a second at the fastest.
# Reading SmolLM2-135M's Q4_1 GGUF (~0.6 bytes a weight, ~90 MB), dequantized through transformers and gguf, and
# saving the head took ~30 s of the 15-minute runs in benchmarks/eagle/eagle-time-limit-smollm2-cpu.json (what was
# left of their 880-924 s after the recorded phases): a few MB a second, so 20 MB/s is several times faster than
# seen; a safetensors folder reads at disk speed, 2 GB/s at most.
GGUF_BYTES_S = 20e6
FOLDER_BYTES_S = 2e9
FP32_OVER_BF16 = 1.9  # the held-out check runs in float32: generating in bfloat16 ran 1.9x faster on a Zen 4
BACKWARD = 3.0  # a training step against the head's forward pass alone (forward + backward, the usual 1 + 2)
C_DRAFT = 0.15  # a draft pass's cost against the target's, conservative: SmolLM2-135M's head measured 0.041 at fp32
# and int8 targets raise it (docs/eagle.md); a larger target makes it smaller
WORTH = 1.2  # the speedup a head is advised to reach: one a user notices, on top of the verify cost's toll
PASSES_USEFUL = 4.0  # passes over the same sequences that still teach: round 4's best fresh head took 3.9; past it the
# head memorises (docs/eagle.md: "the loss steps down at every new pass and stays flat in between")
# (token rows trained on: steps x batch x tokens a sequence, ~165 there; held-out first-draft acceptance), fresh
# SmolLM2-135M heads at peak lr 1e-3 to 2e-3 (docs/performance/smollm2-eagle3-cpu.md): issue #62's 2-minute run,
# 0.018 -> 0.021 (its steps unrecorded: ~10 assumed, an order of magnitude), round 4's 300-step pilot, the
# 600-step standard variant on round 7's data, round 4 (1,400 steps)
ANCHORS = ((1.0e4, 0.02), (4.0e5, 0.37), (8.0e5, 0.434), (1.85e6, 0.497))
CEILING = 0.6  # past the last anchor the curve goes on at its last slope up to this (the best SmolLM2 heads: 0.55)
UNTRAINED = 0.012  # a fresh head started from the target's last layer (round 4's heldout_init)


class TimeLimitTooShortError(ConfigError):
    """A ``--time-limit`` below what the run needs at the least (reading the target, the first replies, the
    held-out checks, saving)."""


def at_least(minutes: float) -> float:
    """``minutes`` rounded up to a limit worth typing: to the half minute below 10, to the minute below 60, else to
    five minutes."""
    step = 0.5 if minutes < 10 else 1.0 if minutes < 60 else 5.0
    return step * math.ceil(minutes / step - 1e-9)


def refuse_below(minutes: float, parts: dict[str, float], who: str = "eagle train") -> None:
    """Raise :class:`TimeLimitTooShortError` when ``minutes`` is below the sum of ``parts`` (seconds by what they
    pay for), naming each part and the least limit to give; ``who``: the command the message names."""
    need = sum(parts.values())
    if 60.0 * minutes >= need:
        return
    said = ", ".join(f"{name} {seconds / 60:.1f} min" if seconds >= 60 else f"{name} {seconds:.0f} s"
                     for name, seconds in parts.items() if seconds >= 0.5)
    raise TimeLimitTooShortError(f"{who}: --time-limit {minutes:g} is below the ~{need / 60:.1f} minutes this "
                                 f"run needs at the least ({said}); give at least {at_least(need / 60):g}")


def weight_bytes(source: Path, gguf: Path | None) -> int:
    """The bytes loading reads: the GGUF, else the folder's weight files."""
    if gguf is not None:
        return gguf.stat().st_size
    return sum(p.stat().st_size for pattern in ("*.safetensors", "*.bin") for p in source.glob(pattern))


def load_floor_s(nbytes: int, gguf: bool) -> float:
    """The least time reading ``nbytes`` of weights can take (a GGUF is dequantized on the way)."""
    return nbytes / (GGUF_BYTES_S if gguf else FOLDER_BYTES_S)


@torch.no_grad()
def token_row_s(writer: Any, taps: Sequence[int], vocab: int, device: torch.device, seq_len: int) -> float:
    """Seconds a token row costs the target as it generates (``writer``: ``precision.generating``'s): one
    forward over 8 rows of 32 tokens, decoder and LM head on every row as a generating step computes them, timed
    warm (the second of two passes)."""
    from .generate import _target_pass

    ids = torch.randint(0, vocab, (8, min(32, seq_len)), generator=torch.Generator().manual_seed(0)).to(device)
    seconds = 0.0
    for _ in range(2):
        t0 = budget.clock()
        _target_pass(writer, taps, False, input_ids=ids, use_cache=False)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = budget.clock() - t0
    return seconds / ids.numel()


def head_share(config: Any, draft_vocab: int, layers: int, ttt_steps: int) -> float:
    """A held-out check's cost a token row against a generating step's, from the weights each multiplies: the head's
    ``ttt_steps`` unrolled steps (``fc`` from three taps, its layers, whose attention reads twice the width, and
    the draft LM head) against the target's layers and full LM head."""
    h, n = config.hidden_size, config.num_attention_heads
    hd = getattr(config, "head_dim", None) or h // n
    kv = getattr(config, "num_key_value_heads", None) or n
    attn = 2 * h * n * hd + 2 * h * kv * hd
    layer = attn + 3 * h * config.intermediate_size
    target = config.num_hidden_layers * layer + config.vocab_size * h
    head = layers * (layer + attn - h * n * hd) + 3 * h * h + draft_vocab * h  # (q, k, v read the 2h-wide input)
    return ttt_steps * head / target


def minimum_parts(elapsed_s: float, row_s: float, rows: dict[str, int], share: float, fp32: float,
                  step_rows: float) -> dict[str, float]:
    """Seconds a time-limited run needs at the least, by what they pay for: reading the target (``elapsed_s``,
    everything so far), the first batches that run whatever the deadlines (``rows``: token rows of prompts,
    held-out and training replies and windows, :func:`.data.first_batches`), the two held-out checks on the
    first held-out batch, the timed steps and one real one (``step_rows`` token rows each), and the save.
    ``row_s``: :func:`token_row_s`; ``share``: :func:`head_share`; ``fp32``: a float32 row against a generating one."""
    check = share * fp32 * row_s
    return {"reading the target": elapsed_s, "the first replies": row_s * sum(rows.values()),
            "the held-out checks": 2 * check * rows.get("heldout", 0),
            "timed steps": (budget.PROBE_STEPS + 1) * BACKWARD * share * row_s * step_rows,
            "saving": budget.SAVE_S}


# ----------------------------------------------------------------------------------- acceptance


def expected_alpha(rows: float) -> float:
    """First-draft held-out acceptance a fresh head reaches after training on ``rows`` token rows: ``ANCHORS``
    interpolated in log(rows), from the untrained head's below the first, on at the last slope above the last up
    to ``CEILING``."""
    if rows <= 0:
        return UNTRAINED
    x = math.log10(rows)
    pts = [(math.log10(r), a) for r, a in ANCHORS]
    if x <= pts[0][0]:
        return max(UNTRAINED, pts[0][1] * x / pts[0][0])  # (from 1 row: log 0)
    for (x0, a0), (x1, a1) in zip(pts, pts[1:]):
        if x <= x1:
            return a0 + (a1 - a0) * (x - x0) / (x1 - x0)
    (x0, a0), (x1, a1) = pts[-2:]
    return min(CEILING, a1 + (a1 - a0) * (x - x1) / (x1 - x0))


def rows_for(alpha: float) -> float:
    """The token rows :func:`expected_alpha` says reach ``alpha`` (inf past ``CEILING``)."""
    if alpha >= CEILING:
        return math.inf
    lo, hi = 0.0, 12.0  # log10 rows
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_alpha(10 ** mid) < alpha else (lo, mid)
    return 10 ** hi


def best_speedup(alpha: float, depth: int, c: float = C_DRAFT) -> float:
    """The best of ``theory.speedup`` over chains of 1..``depth`` drafts, each accepted at ``alpha``."""
    return max(speedup(alpha, g, c) for g in range(1, depth + 1))


def alpha_for(target: float, depth: int, c: float = C_DRAFT) -> float:
    """The least acceptance whose :func:`best_speedup` reaches ``target``."""
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if best_speedup(mid, depth, c) < target else (lo, mid)
    return hi


def measured_speedup(alpha_by_depth: Sequence[float], c: float = C_DRAFT) -> tuple[float, int]:
    """(the best speedup over plain decoding, its chain length) that held-out acceptances by depth give: theory's
    tokens / (gamma c + 1) with the measured tokens a pass of a chain of gamma drafts accepts in place of the i.i.d.
    ``expected_tokens``."""
    best, depth, alive, tokens = 0.0, 1, 1.0, 1.0
    for g, a in enumerate(alpha_by_depth, 1):
        alive *= a
        tokens += alive
        if tokens / (g * c + 1.0) > best:
            best, depth = tokens / (g * c + 1.0), g
    return best, depth


# ----------------------------------------------------------------------------- before and after training


def trained_rows(steps: int, batch_size: int, per_seq: float, unique_rows: float) -> float:
    """Token rows ``steps`` steps of ``batch_size`` sequences train on, as far as they teach: at most
    ``PASSES_USEFUL`` passes over the ``unique_rows`` the data holds."""
    return min(steps * batch_size * per_seq, PASSES_USEFUL * unique_rows)


def forecast(steps: int, start: int, depth: int, rows: float, init_alpha1: float, elapsed_s: float,
             plan: dict | None) -> dict:
    """What a run of ``steps`` steps (resumed at ``start``) should give, before it trains: ``rows`` token rows
    (:func:`trained_rows`), a held-out first-draft acceptance no lower than the head's now (``init_alpha1``), its
    tokens per target pass at ``depth`` and best speedup (theory, i.i.d. drafts), and with a time limit's ``plan``
    the run's seconds in all (``elapsed_s`` so far, the planned steps, the check and save it reserves)."""
    alpha = max(init_alpha1, expected_alpha(rows))
    total = None if plan is None else (elapsed_s + (steps - start) * plan["step_s"] * budget.STEP_MARGIN
                                       + plan["reserve_s"])
    return {"steps": steps, "rows": rows, "alpha1": alpha, "tokens_per_pass": expected_tokens(alpha, depth),
            "speedup": best_speedup(alpha, depth), "c": C_DRAFT, "total_s": total, "elapsed_s": elapsed_s}


def forecast_line(f: dict, init_alpha1: float, limited: bool) -> str:
    """:func:`forecast` in a line, said before training."""
    when = (f"about {f['total_s'] / 60:.1f} min in all ({f['elapsed_s'] / 60:.1f} so far; {f['steps']} steps, then "
            "the held-out check and the save)" if limited and f["total_s"] is not None
            else f"{f['steps']} steps (no --time-limit: not timed ahead)")
    pays = "faster" if f["speedup"] > 1.0 else "no faster"
    return (f"eagle train: expect {when}, and a held-out first-draft acceptance near {f['alpha1']:.2f} (now "
            f"{init_alpha1:.3f}; ~{f['tokens_per_pass']:.2f} tokens per target pass: {pays} than plain decoding at a "
            f"draft cost of {C_DRAFT}) from ~{f['rows']:,.0f} token rows to train on (a rough guide, from "
            "SmolLM2-135M runs)")


def verdict(heldout: dict, depth: int, rows: float, tokens_per_seq: float, cfg: EagleTrainConfig,
            minimum_s: float | None, time_bound: bool) -> dict:
    """Whether the trained head pays (its held-out acceptance by depth, :func:`measured_speedup` at ``C_DRAFT``
    above 1), and when not, what the acceptance curve says more data would give: the token rows that reach a
    ``WORTH`` speedup (at least twice this run's ``rows``), as steps of ``cfg.batch_size`` and sequences
    (``PASSES_USEFUL`` passes over them), and for a run the time limit bound (``time_bound``), the limit whose time
    past the run's least (``minimum_s``) is as many times longer as the rows are."""
    speed, gamma = measured_speedup(heldout["alpha_by_depth"])
    worth = alpha_for(WORTH, depth)
    out = {"c": C_DRAFT, "speedup": speed, "gamma": gamma, "pays": speed > 1.0, "alpha1_break_even":
           alpha_for(1.0, depth), "alpha1_worth": worth, "rows": rows, "advice": None}
    if out["pays"]:
        return out
    needed = rows_for(worth)
    target = max(needed, 2.0 * rows) if math.isfinite(needed) else 10.0 * rows
    per_seq = max(tokens_per_seq, 1.0)
    advice = {"rows": target, "rows_curve": needed if math.isfinite(needed) else None,
              "steps": max(cfg.steps, math.ceil(target / (cfg.batch_size * per_seq))),
              "sequences": max(cfg.num_sequences, math.ceil(target / PASSES_USEFUL / per_seq)), "time_limit": None}
    if cfg.time_limit is not None and time_bound:
        fixed = min(minimum_s or 0.0, 60.0 * cfg.time_limit)
        advice["time_limit"] = at_least((fixed + (60.0 * cfg.time_limit - fixed) * target / max(rows, 1.0)) / 60)
    out["advice"] = advice
    return out


def verdict_line(v: dict, heldout: dict) -> str | None:
    """The warning :func:`verdict` gives for a head that does not pay (None for one that does)."""
    if v["pays"]:
        return None
    a = v["advice"]
    curve = (f"fresh SmolLM2-135M heads reached {v['alpha1_worth']:.2f} at ~{a['rows_curve']:,.0f}"
             if a["rows_curve"] is not None else "the SmolLM2-135M heads measured never reached that")
    data = f"--sequences {a['sequences']} --steps {a['steps']} or more"
    give = f"--time-limit {a['time_limit']:g} or more, with {data}" if a["time_limit"] is not None else data
    return (f"warning: this head is too weak to pay for itself: held-out first-draft acceptance "
            f"{heldout['alpha1']:.3f}, {heldout['tokens_per_pass']:.2f} tokens per target pass, so speculative "
            f"decoding with it would run at ~{v['speedup']:.2f}x plain decoding at a draft cost of {v['c']} (breaking "
            f"even needs a first-draft acceptance near {v['alpha1_break_even']:.2f}, {WORTH}x near "
            f"{v['alpha1_worth']:.2f}). It trained on ~{v['rows']:,.0f} token rows; {curve}: give {give}")
