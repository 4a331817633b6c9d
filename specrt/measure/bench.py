"""Tokens/s and the figures behind them, per method, measured in ONE run on the same backend.

Speedups are ratios to ``none`` measured in the same run with the methods interleaved per repeat (each
repeat starting one method later), so drift of the machine hits every method alike; peers (``specrt.measure.peers``: Hugging Face, ONNX Runtime
GenAI) run inside the same loop. Nothing here is a timed assertion.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from .. import theory
from ..bundle.machine import kernel_choice_note
from ..errors import ConfigError
from ..runtime.drafters import drafter_class, proposes_trees
from ..runtime.generator import SpeculativeGenerator
from ..runtime.options import DecodeOptions
from ..runtime.sampling import SamplingConfig
from ..runtime.stats import mean_pass_seconds
from ..runtime.tree import DEFAULT_EAGLE_TREE, DynamicTree, TreeShape
from . import roofline
from .bandwidth import Bandwidth
from .energy import per_token as energy_per_token
from .peers import COUNTING, Peer, PeerRun


def default_methods(gen: SpeculativeGenerator) -> tuple[str, ...]:
    """What ``specrt bench`` measures unless told: plain decoding and every method the bundle can run (its
    EAGLE-3 head; its DFlash draft; its draft model's chain and tree; prompt lookup, which needs no model), without
    the tree methods where its graphs are causal only (gqa-static)."""
    methods = (("none",) + (("eagle", "eagle-tree") if gen.manifest.eagle is not None else ())
               + (("dflash",) if gen.manifest.dflash is not None else ())
               + (("draft", "tree") if gen.manifest.draft is not None else ()) + ("ngram",))
    return tuple(m for m in methods if gen.manifest.runs_trees or not proposes_trees(m))


def bench_notes(gen: SpeculativeGenerator) -> list[str]:
    """What the report notes about the loaded bundle: each model whose session is the low-memory one, and why;
    a target whose int8 format was chosen by timing on another CPU."""
    notes = [f"memory: {n}" for n in gen.memory_notes]
    moved = kernel_choice_note(gen.manifest.target.quantization)
    return notes + ([moved] if moved else [])


def read_prompts(path: str | Path) -> list[str]:
    """A JSON list of strings, or a text file with one prompt per line (\\n escapes allowed)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read prompts from {p}: {e.strerror}") from None
    if p.suffix == ".json":
        prompts = json.loads(text)
    else:
        prompts = [line.replace("\\n", "\n") for line in text.splitlines() if line.strip()]
    if not prompts or not all(isinstance(x, str) for x in prompts):
        raise ConfigError(f"{p} holds no prompts")
    return prompts


@dataclass(frozen=True)
class BenchConfig:
    methods: tuple[str, ...] = ("none", "draft", "tree", "ngram")
    max_new_tokens: int = 128
    repeats: int = 3
    gamma: int | str = 4
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    tree: TreeShape = TreeShape()
    eagle_tree: DynamicTree = DEFAULT_EAGLE_TREE
    draft_stop: float = 0.0  # chains end where the drafter's probability of its next token is below it
    row_stable: bool = False  # no one-row target pass after the prefill (DecodeOptions.row_stable)
    seed: int = 0  # repeat r samples with seed + r
    # With sampling: also greedy plain decoding in every repeat, right beside the sampled none run, so
    # that what sampling costs is a ratio measured in one run (separate runs drift apart on a busy machine).
    greedy_baseline: bool = True
    # Each prompt is a user's message to an instruct model, rendered with the bundle's chat template.
    chat: bool = False
    # Each prompt runs every method before the next prompt, the order rotating by prompt: a machine whose speed
    # drifts within a run (a shared VM: plain decoding went from 98 to 77 tokens/s within one repeat) weighs on
    # every method alike. False: each method over every prompt in turn (what --energy meters needs).
    interleave: bool = True

    def __post_init__(self) -> None:
        for method in self.methods:
            self.options(method, 0)  # validates the sampling settings, each gamma and the trees
        if "none" not in self.methods:
            raise ConfigError("methods must include 'none': every speedup is measured against it")
        if self.repeats < 1 or self.max_new_tokens < 1:
            raise ConfigError("repeats and max_new_tokens must be >= 1")

    def options(self, method: str, repeat: int) -> DecodeOptions:
        """What ``method`` decodes with in repeat ``repeat`` (its seed: seed + repeat); ``NAME@GAMMA`` (eagle@1,
        draft@auto) overrides ``gamma`` for that entry, so chains of several lengths share one run."""
        name, gamma = method_spec(method, self.gamma)
        return DecodeOptions(max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_k=self.top_k,
                             top_p=self.top_p, seed=self.seed + repeat, method=name, gamma=gamma, tree=self.tree,
                             eagle_tree=self.eagle_tree, draft_stop=self.draft_stop, row_stable=self.row_stable)


def method_spec(method: str, gamma: int | str) -> tuple[str, int | str]:
    """``eagle@2`` → ("eagle", 2), ``eagle@auto`` → ("eagle", "auto"), ``eagle`` → ("eagle", ``gamma``)."""
    name, at, value = method.partition("@")
    if not at:
        return method, gamma
    if value == "auto":
        return name, value
    try:
        return name, int(value)
    except ValueError:
        raise ConfigError(f"{method!r}: a method's own gamma must look like eagle@2 or eagle@auto") from None


def run_bench(gen: SpeculativeGenerator, prompts: list[str], cfg: BenchConfig,
              on_progress: Callable[[str], None] | None = None, peers: Sequence[Peer] = (),
              bandwidth: Bandwidth | None = None, energy=None) -> dict:
    """Median over repeats of whole-prompt-set figures per method and peer; greedy runs also check parity
    with none. Peers decode from specrt's prompt ids with the same sampling settings and seeds.

    Every row has ``bytes_per_token`` (weights + KV cache read per generated token); with ``bandwidth``
    also the bandwidth achieved, its share of the roofline and the roofline's tokens/s; with ``energy``
    (an :class:`specrt.measure.energy.EnergyMeter`) joules per token, measured around each method's prompts."""
    prompt_ids = [encode(gen, p, cfg.chat) for p in prompts]
    specs = {m: method_spec(m, cfg.gamma) for m in cfg.methods}  # entry -> (method name, its gamma)
    _warm_up(gen, prompt_ids, cfg, specs, peers)
    runs = _Runs.of(cfg, peers)
    for r in range(cfg.repeats):
        _run_repeat(gen, prompt_ids, cfg, r, runs, peers, on_progress, energy)
    costs = model_costs(gen)
    result = {"config": _config(gen, cfg, len(prompts), costs, energy),
              "methods": _method_rows(gen, cfg, specs, runs, costs, bandwidth)}
    if runs.greedy:
        result["greedy_baseline"] = {k: statistics.median(g[k] for g in runs.greedy)
                                     for k in ("tokens_per_second", "host_ms_per_token", "target_pass_ms")}
    if bandwidth is not None:
        result["roofline"] = _roofline(result["methods"]["none"], bandwidth)
    if peers:
        result["config"]["peers"] = {
            "sampling": {"temperature": cfg.temperature, "top_k": cfg.top_k, "top_p": cfg.top_p,
                         "seeds": [cfg.seed + r for r in range(cfg.repeats)]},
            "prompt_ids": "specrt's: every peer decodes from the ids specrt's tokenizer made",
            "counting": COUNTING}
        # With --chat the peer's tokenizer is asked for the text specrt's template rendered, not the bare message.
        texts = [gen.render_chat([{"role": "user", "content": p}]) for p in prompts] if cfg.chat else prompts
        result["peers"] = {p.name: _peer_row(p, runs.peers[p.name], texts, prompt_ids, result["methods"],
                                             runs.outputs["none"] if cfg.temperature == 0 else None) for p in peers}
    return result


@dataclass
class _Runs:
    """What the repeats measured: per method entry its aggregate of each repeat, per peer its runs, each
    method's tokens in the first repeat, and the greedy baseline's aggregates (sampled runs)."""

    methods: dict[str, list[dict]]
    peers: dict[str, list[PeerRun]]
    outputs: dict[str, list[list[int]]]
    greedy: list[dict]

    @classmethod
    def of(cls, cfg: BenchConfig, peers: Sequence[Peer]) -> "_Runs":
        return cls({m: [] for m in cfg.methods}, {p.name: [] for p in peers}, {}, [])


def _warm_up(gen: SpeculativeGenerator, prompt_ids: list[list[int]], cfg: BenchConfig,
             specs: dict[str, tuple[str, int | str]], peers: Sequence[Peer]) -> None:
    """First-call allocations, and the verify costs a method reads, before anything is timed."""
    gen.stream_ids(prompt_ids[0], max_new_tokens=8, method="none").result  # warm-up: first-call allocations
    if any((g == "auto" and name != "none" and not proposes_trees(name)) or drafter_class(name).proposes_for_free
           for name, g in specs.values()):
        gen.verify_costs()  # auto gamma and a lookup's gate measure them once per bundle: not in a timed generation
    if any(drafter_class(name).sizes_tree_by_cost for name, _ in specs.values()):
        gen.tree_verify_costs(cfg.eagle_tree)  # the same, for a tree sized by cost
    sampling = SamplingConfig(cfg.temperature, cfg.top_k, cfg.top_p)
    for peer in peers:
        peer.generate(prompt_ids[:1], 8, sampling, cfg.seed)  # warm-up


def _run_repeat(gen: SpeculativeGenerator, prompt_ids: list[list[int]], cfg: BenchConfig, r: int, runs: _Runs,
                peers: Sequence[Peer], on_progress: Callable[[str], None] | None, energy) -> None:
    """Repeat ``r``: every method over every prompt, then every peer. It starts one method later than the
    repeat before: on a machine whose speed drifts within a repeat, no method always runs in the same slot
    (right after the slowest one, say)."""
    sampling = SamplingConfig(cfg.temperature, cfg.top_k, cfg.top_p)
    shift = r % len(cfg.methods)
    order = cfg.methods[shift:] + cfg.methods[:shift]
    if _interleaves(cfg, energy):
        _interleaved(gen, prompt_ids, cfg, r, runs, order, on_progress)
    else:
        _in_blocks(gen, prompt_ids, cfg, r, runs, order, on_progress, energy)
    for peer in peers:
        if on_progress:
            on_progress(f"repeat {r + 1}/{cfg.repeats} · {peer.name}")
        runs.peers[peer.name].append(peer.generate(prompt_ids, cfg.max_new_tokens, sampling, cfg.seed + r))


def _interleaves(cfg: BenchConfig, energy) -> bool:
    """Whether the methods take turns prompt by prompt: asked for, and no energy meter that reads blocks."""
    return cfg.interleave and energy is None


def _wants_baseline(cfg: BenchConfig) -> bool:
    """Whether greedy plain decoding runs beside a sampled none, the baseline of "vs greedy"."""
    return cfg.greedy_baseline and not SamplingConfig(cfg.temperature, cfg.top_k, cfg.top_p).greedy


def _baseline_options(cfg: BenchConfig) -> DecodeOptions:
    """Greedy plain decoding at the bench's length: the baseline's settings, in either order."""
    return DecodeOptions(max_new_tokens=cfg.max_new_tokens, method="none")


def _interleaved(gen: SpeculativeGenerator, prompt_ids: list[list[int]], cfg: BenchConfig, r: int, runs: _Runs,
                 order: tuple[str, ...], on_progress: Callable[[str], None] | None) -> None:
    """Each prompt through every method (the greedy baseline right after none), the order rotating by prompt."""
    results: dict[str, list] = {m: [] for m in order}
    greedy = _baseline_options(cfg)
    wants_baseline, baseline = _wants_baseline(cfg), []
    for i, ids in enumerate(prompt_ids):
        if on_progress:
            on_progress(f"repeat {r + 1}/{cfg.repeats} · prompt {i + 1}/{len(prompt_ids)}, every method")
        for method in order[i % len(order):] + order[:i % len(order)]:
            results[method].append(gen.stream_ids(ids, cfg.options(method, r)).result)
            if method == "none" and wants_baseline:
                baseline.append(gen.stream_ids(ids, greedy).result.stats)
    for method, out in results.items():
        runs.outputs.setdefault(method, [s.token_ids for s in out])
        runs.methods[method].append(_aggregate([s.stats for s in out]))
    if baseline:
        runs.greedy.append(_aggregate(baseline))


def _in_blocks(gen: SpeculativeGenerator, prompt_ids: list[list[int]], cfg: BenchConfig, r: int, runs: _Runs,
               order: tuple[str, ...], on_progress: Callable[[str], None] | None, energy) -> None:
    """Each method over every prompt in turn, metered as a block where ``energy`` is given."""
    for method in order:
        beside = _wants_baseline(cfg) and method == "none"  # the baseline: before none on even repeats, after on odd
        if beside and r % 2 == 0:
            runs.greedy.append(_greedy_none(gen, prompt_ids, cfg, on_progress, r))
        if on_progress:
            on_progress(f"repeat {r + 1}/{cfg.repeats} · {method}")
        if energy is not None:
            energy.begin()
        options = cfg.options(method, r)
        stats = [gen.stream_ids(ids, options).result for ids in prompt_ids]
        runs.outputs.setdefault(method, [s.token_ids for s in stats])
        joules = sum(energy.end().values()) if energy is not None else None
        runs.methods[method].append(_aggregate([s.stats for s in stats], joules))
        if beside and r % 2 == 1:
            runs.greedy.append(_greedy_none(gen, prompt_ids, cfg, on_progress, r))


def _config(gen: SpeculativeGenerator, cfg: BenchConfig, prompts: int, costs: dict[str, roofline.ModelCost],
            energy) -> dict:
    """The run's settings, the bundle and backend it measured, and each graph's cost."""
    return {"methods": list(cfg.methods), "max_new_tokens": cfg.max_new_tokens, "repeats": cfg.repeats,
            "gamma": cfg.gamma, "draft_stop": cfg.draft_stop, "row_stable": cfg.row_stable,
            "tree": list(cfg.tree.widths),
            "eagle_tree": str(cfg.eagle_tree), "temperature": cfg.temperature,
            "top_k": cfg.top_k, "top_p": cfg.top_p, "prompts": prompts, "chat": cfg.chat,
            "order": "interleaved" if _interleaves(cfg, energy) else "blocks",
            "vocab": gen.manifest.target.dims.vocab_size,
            "provider": gen.decoders["target"].provider, "bundle": str(gen.bundle),
            "model_costs": {role: {"weight_bytes": c.weight_bytes,
                                   "matmul_flops_per_token": c.matmul_flops_per_token, "source": c.source}
                            for role, c in costs.items()},
            **({"energy_sources": energy.names} if energy is not None else {})}


def _method_rows(gen: SpeculativeGenerator, cfg: BenchConfig, specs: dict[str, tuple[str, int | str]], runs: _Runs,
                 costs: dict[str, roofline.ModelCost], bandwidth: Bandwidth | None) -> dict[str, dict]:
    """Each method entry's medians over repeats, its ratios to none, what the theory predicts for its measured
    α and c, and its traffic."""
    base = statistics.median(x["tokens_per_second"] for x in runs.methods["none"])
    decode_ms = statistics.median(x["target_pass_ms"] for x in runs.methods["none"])
    rows = {}
    for method, reps in runs.methods.items():
        row = {k: statistics.median(x[k] for x in reps if x[k] is not None) if any(x[k] is not None for x in reps)
               else None for k in reps[0]}
        row["speedup_vs_none"] = row["tokens_per_second"] / base
        # The theory counts cost in plain decode steps: c = draft pass / plain target pass. Verifying
        # γ+1 tokens costs more than one plain pass on a CPU; verify_cost shows by how much.
        row["c"] = row["draft_pass_ms"] / decode_ms if row["draft_pass_ms"] else 0.0
        row["verify_cost"] = row["target_pass_ms"] / decode_ms
        name = specs[method][0]
        row.update(_predicted(row, name))
        if cfg.temperature == 0:
            row["greedy_matches_none"] = runs.outputs[method] == runs.outputs["none"]
        if runs.greedy:  # each repeat's own ratio: its runs were neighbours in time
            row["vs_greedy_none"] = statistics.median(x["tokens_per_second"] / g["tokens_per_second"]
                                                      for x, g in zip(reps, runs.greedy))
        row.update(_traffic(row, name, costs, gen, bandwidth))
        rows[method] = row
    return rows


def _predicted(row: dict, method: str) -> dict:
    """A chain's speedup as the theory predicts it at the measured α, γ and c (and with the measured verify
    cost), and the achieved speedup over it; None for trees and plain decoding."""
    gamma = round(row["mean_gamma"])
    if row["alpha"] is None or not gamma or proposes_trees(method):
        return {"predicted_speedup": None}
    alpha = min(row["alpha"], 1.0)
    predicted = theory.speedup(alpha, gamma, row["c"])
    with_verify_cost = theory.expected_tokens(alpha, gamma) / (gamma * row["c"] + row["verify_cost"])
    return {"predicted_speedup": predicted, "predicted_with_verify_cost": with_verify_cost,
            "achieved_over_predicted": row["speedup_vs_none"] / predicted}


def _roofline(plain: dict, bandwidth: Bandwidth) -> dict:
    """The bandwidth the roofline was drawn at and plain decoding against it."""
    return {"device": bandwidth.device, "read_gbps": bandwidth.read_gbps,
            "copy_gbps": bandwidth.copy_gbps, "array_bytes": bandwidth.array_bytes,
            "plain_bytes_per_token": plain["bytes_per_token"],
            "plain_roofline_tokens_per_second": plain["roofline_tokens_per_second"],
            "plain_tokens_per_second": plain["tokens_per_second"]}


def encode(gen: SpeculativeGenerator, prompt: str, chat: bool) -> list[int]:
    """A prompt's ids: as text, or as a user's message in the bundle's chat template."""
    return gen.encode_chat([{"role": "user", "content": prompt}]) if chat else gen.encode(prompt)


def _greedy_none(gen: SpeculativeGenerator, prompt_ids: list[list[int]], cfg: BenchConfig,
                 on_progress: Callable[[str], None] | None, r: int) -> dict:
    """One repeat of greedy plain decoding over the prompts: the baseline a sampled run is measured against."""
    if on_progress:
        on_progress(f"repeat {r + 1}/{cfg.repeats} · none, greedy (the baseline)")
    greedy = _baseline_options(cfg)
    return _aggregate([gen.stream_ids(ids, greedy).result.stats for ids in prompt_ids])


def _peer_row(peer: Peer, reps: list[PeerRun], prompts: list[str], prompt_ids: list[list[int]], ours: dict,
              none_tokens: list[list[int]] | None) -> dict:
    """A peer's median tokens/s, each method's ratio to it, whether its own tokenizer gives specrt's prompt
    ids, and (greedy) the share of prompts where its tokens equal specrt none's."""
    tps = statistics.median(x.tokens_per_second for x in reps)
    row = {"description": peer.description, **peer.details, "tokens_per_second": tps,
           "new_tokens": statistics.median(sum(len(t) for t in x.token_ids) for x in reps),
           "prompt_ids_equal": _share(peer.encode(p) == ids for p, ids in zip(prompts, prompt_ids)),
           "over_peer": {m: r["tokens_per_second"] / tps for m, r in ours.items()}}
    if none_tokens is not None:
        row["greedy_matches_none"] = _share(a == b for a, b in zip(reps[0].token_ids, none_tokens))
        # A near-tie flips one token and everything after it: how far the outputs agree says more than "equal"
        row["greedy_common_prefix"] = statistics.mean(_common(a, b) / max(1, len(b))
                                                      for a, b in zip(reps[0].token_ids, none_tokens))
    return row


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _share(flags) -> float:
    flags = list(flags)
    return sum(flags) / len(flags)


def model_costs(gen: SpeculativeGenerator) -> dict[str, roofline.ModelCost]:
    """Weight bytes and matmul FLOPs per pass of each graph the bundle runs (target, draft, EAGLE-3 head,
    Medusa heads)."""
    m = gen.manifest
    costs = {role: roofline.entry_cost(gen.bundle, entry) for role, entry in m.models.items()}
    if m.eagle is not None:
        costs["eagle"] = roofline.entry_cost(gen.bundle, m.eagle)
    if m.medusa is not None:
        costs["medusa"] = roofline.file_cost(Path(gen.bundle) / m.medusa.file, np.dtype(m.target.dtype).itemsize)
    return costs


def _traffic(row: dict, method: str, costs: dict[str, roofline.ModelCost], gen: SpeculativeGenerator,
             bandwidth: Bandwidth | None) -> dict:
    """Bytes per generated token from the measured passes per token at the measured mean context (the
    draft reads its own cache over the same positions), and what the bandwidth makes of them."""
    m = gen.manifest
    weights = costs["target"].weight_bytes + (costs["medusa"].weight_bytes if method == "medusa" else 0)
    ctx = row["mean_context"]
    target = roofline.PassBytes(weights, roofline.kv_bytes_per_position(m.target.dims, m.target.dtype) * ctx)
    # What a draft pass runs: the EAGLE-3 head for eagle methods, the draft model for draft and tree.
    cls = drafter_class(method)
    role, entry = (("eagle", m.eagle) if cls.needs_eagle else ("dflash", m.dflash) if cls.needs_dflash else
                   ("draft", m.draft) if cls.needs_draft_model else (None, None))
    draft = (roofline.PassBytes(costs[role].weight_bytes, roofline.kv_bytes_per_position(entry.dims, entry.dtype) * ctx)
             if entry is not None else None)
    b = roofline.bytes_per_token(1.0, row["target_passes_per_token"], target,
                                 row["draft_passes_per_token"] if draft else 0.0, draft)
    # Arithmetic per token against plain decoding, as measured (Eq. 11's counterpart): each target pass
    # computes mean_gamma + 1 positions, each draft pass one; Medusa's heads are not counted.
    flops_t = costs["target"].matmul_flops_per_token
    ops = (row["target_passes_per_token"] * (row["mean_gamma"] + 1)
           + (row["draft_passes_per_token"] * costs[role].matmul_flops_per_token / flops_t if draft else 0.0)
           if flops_t else None)  # a graph whose matmuls the cost reader does not know counts none
    out: dict = {"bytes_per_token": b, "ops_factor": ops}
    if bandwidth is not None:
        achieved = roofline.achieved_gbps(b, row["tokens_per_second"])
        out.update(achieved_gbps=achieved, roofline_fraction=achieved / bandwidth.read_gbps,
                   roofline_tokens_per_second=roofline.roofline_tokens_per_second(bandwidth.read_gbps, b))
    return out


def _aggregate(stats: list, joules: float | None = None) -> dict:
    tokens = sum(s.new_tokens for s in stats)
    total = sum(s.total_s for s in stats)
    passes = sum(s.target_passes for s in stats)
    drafted, accepted = sum(s.drafted for s in stats), sum(s.accepted for s in stats)
    betas = [s.alpha_estimate for s in stats if s.alpha_estimate is not None]
    draft_passes = sum(s.draft_passes for s in stats)
    verify_s, draft_s = sum(s.verify_s for s in stats), sum(s.draft_s for s in stats)
    t_target, t_draft = mean_pass_seconds(stats)
    return {
        "tokens_per_second": tokens / total,
        "tokens_per_target_pass": sum(s.tokens_per_target_pass * s.target_passes for s in stats) / passes,
        "acceptance_rate": accepted / drafted if drafted else None,
        "alpha": statistics.mean(betas) if betas else None,
        "mean_gamma": statistics.mean(s.mean_gamma for s in stats),
        "target_pass_ms": 1000 * t_target,
        "draft_pass_ms": None if t_draft is None else 1000 * t_draft,
        "share_draft": draft_s / total, "share_verify": verify_s / total,
        "share_prefill": sum(s.prefill_s for s in stats) / total,
        "share_host": sum(s.other_s for s in stats) / total,
        # Host work per token: everything outside the engines' run calls (binding, warping, sampling,
        # acceptance, cache bookkeeping, detokenising), across draft and target.
        "host_ms_per_token": 1000 * sum(s.host_s for s in stats) / tokens,
        "share_engine": sum(s.engine_s for s in stats) / total,
        "d2h_bytes_per_target_pass": statistics.mean(s.d2h_bytes_per_target_pass for s in stats),
        "target_passes_per_token": passes / tokens,
        "draft_passes_per_token": draft_passes / tokens,
        # Positions each pass reads on average: passes run from the prompt's end to its end + new tokens.
        "mean_context": statistics.mean(s.prompt_tokens + s.new_tokens / 2 for s in stats),
        **({} if joules is None else _energy(joules, tokens)),
    }


def _energy(joules: float, tokens: int) -> dict:
    # A counter that did not advance (NVML updates every 20-100 ms) measured nothing: None, not infinity.
    if joules <= 0:
        return {"joules": None, "joules_per_token": None, "tokens_per_joule": None}
    j_tok, tok_j = energy_per_token(joules, tokens)
    return {"joules": joules, "joules_per_token": j_tok, "tokens_per_joule": tok_j}


def make_peers(gen: SpeculativeGenerator, kinds: Sequence[str], hf_target: str | None = None,
               hf_draft: str | None = None, threads: int | None = None, peer_precision: str | None = None,
               peer_cache: str | Path | None = None, on_progress: Callable[[str], None] | None = None,
               peer_gguf: str | Path | None = None) -> list[Peer]:
    """The peers of the registered ``kinds`` (``measure.peers.peer_kinds()``: "hf", "llamacpp", "ortgenai") on
    the bundle's source checkpoints (or ``hf_target`` / ``hf_draft``, and ``peer_gguf`` for llama.cpp); a kind
    that builds its own model (ONNX Runtime GenAI) builds it at the bundle's precision, or ``peer_precision``."""
    from .peers import PeerRequest, create_peers

    m = gen.manifest
    draft = hf_draft or (m.draft.source if m.draft else None)
    return create_peers(kinds, PeerRequest(Path(hf_target or m.target.source), Path(draft) if draft else None,
                                           m.target, threads, peer_precision,
                                           Path(peer_cache) if peer_cache else None, on_progress,
                                           Path(peer_gguf) if peer_gguf else None))
