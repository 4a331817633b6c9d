"""What bounds an EAGLE-3 training run besides its settings (:mod:`specrt.export.eagle.train`): a wall-clock limit
(``--time-limit``), and the host memory and disk the data cache needs.

Under a limit the run is sized by what it measures instead of by guesses: the target writes prompts and replies
until its share of the limit is spent (held-out replies first, within their own share of it), each batch cut
token-step by token-step at its deadline, then a few training steps timed on a copy price a token row, the
batches to come (known in advance) say how many steps fit before the held-out check and the save, and the
learning-rate schedule is laid over those steps. A run that overruns its plan anyway stops at the limit and saves
the head it has. A limit below what the run needs at the least is refused before anything is generated
(:mod:`.forecast`). Without a limit the data still stops where the host's memory or the cache's disk would run
out, rather than failing after hours of generating."""

from __future__ import annotations

import itertools
import os
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

DATA_SHARE = 0.5  # of the limit: prompts, replies and the cache; the rest trains, checks and saves
PROMPT_SHARE = 1 / 3  # of the data share: self-written prompts, so replies to them get the rest
HELDOUT_SHARE = 0.25  # of the time left for replies when they start: the held-out replies and text windows (uncut,
# 397 held-out replies took 2.5 of a 15-minute SmolLM2 run's 5 minutes of replies: performance/smollm2-eagle3-cpu.md)
MIN_NEW = 4  # tokens each row of a batch writes before a deadline may cut it: a reply cut shorter teaches little,
# and the first batches (held-out, training) must leave something to train and check on
PROBE_STEPS = 4  # steps timed on a copy (the first untimed) before a time-limited run plans its step count
STEP_MARGIN = 1.05  # checkpoints, and batches the timed steps did not sample (SmolLM2, CPU: real ones ran 4 % over)
EVAL_MARGIN = 1.1  # the final held-out check against the first one, timed (its head is the saved copy)
EVAL_FRACTION = 0.8  # a held-out batch's cost against a training step's on as many tokens (SmolLM2-135M, CPU),
# for a resumed run whose first check was not timed
SAVE_S = 10.0  # the head's files, training.json and removing the cache
MEMORY_USE = 0.8  # of the memory available when generating starts
DISK_USE = 0.9  # of the disk free where the cache is saved


def clock() -> float:
    """The clock every deadline here is a reading of (``time.perf_counter``); tests put a fake one in its place."""
    return time.perf_counter()


@dataclass(frozen=True)
class TimeLimit:
    """A run's wall-clock limit: ``start`` is a ``time.perf_counter()`` reading, ``seconds`` the limit."""

    start: float
    seconds: float

    @classmethod
    def minutes(cls, minutes: float | None, start: float) -> TimeLimit | None:
        return None if minutes is None else cls(start, 60.0 * minutes)

    @property
    def prompts_end(self) -> float:
        return self.start + DATA_SHARE * PROMPT_SHARE * self.seconds

    @property
    def data_end(self) -> float:
        return self.start + DATA_SHARE * self.seconds

    @property
    def end(self) -> float:
        return self.start + self.seconds

    def left(self) -> float:
        return self.end - clock()


@dataclass(frozen=True)
class DataLimits:
    """Where generating stops early: ``until`` / ``prompts_until`` (perf_counter deadlines, None: no limit) and
    ``max_rows`` sequences (training and held-out), what ``bound_by`` ("memory" or "disk") holds."""

    until: float | None = None
    prompts_until: float | None = None
    max_rows: int | None = None
    bound_by: str | None = None

    def out_of_time(self) -> bool:
        return self.until is not None and clock() >= self.until

    def heldout_until(self, now: float) -> float | None:
        """The held-out replies' and windows' deadline when replies start at ``now``: HELDOUT_SHARE of what is
        left of the data's time (none without a limit; at ``now`` when the data's time is already spent)."""
        return None if self.until is None else now + HELDOUT_SHARE * max(0.0, self.until - now)


def row_bytes(seq_len: int, target_hidden: int, topk: int, taps: int = 3) -> tuple[int, int]:
    """(bytes one generated sequence holds until it is cached, bytes its cache row takes in memory and on disk),
    at most: ``taps`` tapped states fp16 H each (EAGLE-3's three; a DFlash draft's one a layer), the final state
    fp32 H, token and argmax a token while generating; in the cache (``eagle_data.SequenceCache``, padded to
    seq_len) taps fp16, top-k log-probs fp16 and ids int32, token and argmax int32 a token, and three int32 a row."""
    return (seq_len * (taps * target_hidden * 2 + target_hidden * 4 + 8),
            seq_len * (taps * target_hidden * 2 + topk * 6 + 8) + 12)


def free_disk(path: Path) -> int:
    """Bytes free on the file system ``path`` would be written to (its nearest existing ancestor's)."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def data_limits(limit: TimeLimit | None, cache_dir: Path, seq_len: int, target_hidden: int, topk: int,
                memory: int | None = None, disk: int | None = None, taps: int = 3) -> DataLimits:
    """The run's :class:`DataLimits`: its time limit's deadlines, and as many sequences as fit in ``memory``
    (default: what is available now) while generated and cached at once, and on ``disk`` (default: free at
    ``cache_dir``) once cached, each holding ``taps`` tapped states a token."""
    from ...runtime.backends.onnxruntime import available_memory  # (MemAvailable; None off Linux)

    gen, cached = row_bytes(seq_len, target_hidden, topk, taps)
    memory = available_memory() if memory is None else memory
    caps = {"disk": int(DISK_USE * (free_disk(cache_dir) if disk is None else disk)) // cached}
    if memory is not None:
        caps["memory"] = int(MEMORY_USE * memory) // (gen + cached)
    bound_by = min(caps, key=caps.__getitem__)
    return DataLimits(None if limit is None else limit.data_end, None if limit is None else limit.prompts_end,
                      caps[bound_by], bound_by)


def plan_steps(costs: Iterable[float], left_s: float, reserve_s: float, max_steps: int) -> int:
    """How many of the next steps, whose seconds ``costs`` estimates in order, fit in ``left_s`` less
    ``reserve_s`` (kept for what follows training), each with STEP_MARGIN: at most ``max_steps``, at least one."""
    room, spent, n = left_s - reserve_s, 0.0, 0
    for cost in itertools.islice(costs, max_steps):
        spent += cost * STEP_MARGIN
        if spent > room:
            break
        n += 1
    return max(1, n)


def padded_tokens(lengths: Sequence[int], index: Sequence[int]) -> int:
    """Token rows a batch of the sequences ``index`` computes: each cut to the batch's longest
    (``SequenceCache.batch``). A step's time is about proportional to it, so timed steps price any other."""
    return len(index) * max(lengths[i] for i in index)


def time_steps(step: Callable[[int], object], steps: Sequence[int], device: torch.device) -> list[tuple[int, float]]:
    """(step, seconds) for each of ``steps`` but the first (allocations, autotuning; the only one when there is
    one), as ``step(k)`` runs it (a whole training step, on a copy of the head and its optimizer)."""
    timed = []
    for k in steps:
        t0 = time.perf_counter()
        step(k)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        timed.append((k, time.perf_counter() - t0))
    return timed[1:] or timed


def in_order_tokens(lengths: Sequence[int], batch_size: int) -> int:
    """Token rows of the sequences ``lengths`` in batches of ``batch_size`` taken in order (the held-out check's)."""
    return sum(padded_tokens(lengths, range(lo, min(len(lengths), lo + batch_size)))
               for lo in range(0, len(lengths), batch_size))


def plan_training(step: Callable[[int], object], tokens: Callable[[int], int], start: int, max_steps: int,
                  limit: TimeLimit, device: torch.device, evaluate_s: float | None, eval_tokens: int) -> dict:
    """The training steps ``start``.. that fit what is left of ``limit``: the next steps, run on a copy
    (:func:`time_steps`), price a token row, each later step costs its batch's rows (``tokens(step)``), and the
    held-out check's time (``evaluate_s`` as the run's first one took, else priced from ``eval_tokens``) and the
    save are kept. Returns the plan training.json records: steps (the last step's index + 1), s_per_token, step_s
    (the planned steps' mean), reserve_s, evaluate_s."""
    timed = time_steps(step, range(start, min(max_steps, start + PROBE_STEPS)), device)
    rate = sum(s for _, s in timed) / max(1, sum(tokens(k) for k, _ in timed))
    check = EVAL_FRACTION * rate * eval_tokens if evaluate_s is None else evaluate_s
    reserve = EVAL_MARGIN * check + SAVE_S
    n = plan_steps((rate * tokens(k) for k in range(start, max_steps)), limit.left(), reserve, max_steps - start)
    step_s = sum(rate * tokens(k) for k in range(start, start + n)) / n
    return {"steps": start + n, "s_per_token": rate, "step_s": step_s, "reserve_s": reserve, "evaluate_s": check}
