"""``specrt verify``: the equivalence checks a deployer runs after an export or an engine build.

Each check says PASS/FAIL with its figures. Exact speculative sampling hides a bad draft from the
output (the target corrects every token), so a broken draft shows up as an acceptance rate too low
to ever pay for itself; precision problems show up against the PyTorch logits stored at export.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from .. import theory
from ..bundle.parity import decisive
from ..runtime.drafters import proposes_trees
from ..runtime.generator import SpeculativeGenerator
from ..runtime.masks import causal_mask
from ..runtime.sampling import SamplingConfig, probs_from_logits
from ..runtime.stats import mean_pass_seconds


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str
    figures: dict = field(default_factory=dict)


def _encode(gen: SpeculativeGenerator, prompt: str, chat: bool) -> list[int]:
    return gen.encode_chat([{"role": "user", "content": prompt}]) if chat else gen.encode(prompt)


def _generate(gen: SpeculativeGenerator, prompt: str, chat: bool, **options):
    return gen.stream_ids(_encode(gen, prompt, chat), **options).result


def check_golden(gen: SpeculativeGenerator, role: str) -> Check:
    """This backend's logits vs PyTorch's at export, on the manifest's fixed prompt."""
    entry = gen.manifest.models[role]
    name = f"{role} logits vs PyTorch"
    if not entry.golden:
        return Check(name, False, "the bundle records no reference logits: re-export it with this specrt")
    g = entry.golden
    ids = np.asarray(g["input_ids"], np.int64)
    dec = gen.decoders[role]
    logits = dec.forward(dec.new_cache(len(ids)), ids, np.arange(len(ids)), causal_mask(len(ids), 0)).logits
    if entry.quantization:
        return _golden_agreement(name, entry, logits, dec.provider)
    got = np.take_along_axis(logits, np.asarray(g["top_ids"]), axis=-1)
    diff = np.abs(got - np.asarray(g["top_logits"])).max(axis=-1)
    tol = entry.parity_tolerance
    if "scale" not in g or "rel" not in tol:  # a bundle from before the relative criterion
        worst = float(diff.max())
        return Check(name, worst <= tol.get("abs", 0.0), f"max |diff| {worst:.2e} (tolerance "
                     f"{tol.get('abs', 0.0):g}, {dec.provider})", {"max_abs_diff": worst, "tolerance": tol})
    rel = float((diff / np.asarray(g["scale"])).max())
    return Check(name, rel <= tol["rel"], f"max |diff| / logit scale {rel:.2e} (tolerance {tol['rel']:g}, "
                 f"{dec.provider})", {"max_rel_diff": rel, "max_abs_diff": float(diff.max()), "tolerance": tol})


def _golden_agreement(name: str, entry, logits: np.ndarray, provider: str) -> Check:
    """A quantized graph cannot match the float logits to a tolerance: its check is that its best token
    is PyTorch's wherever PyTorch was decisive (``bundle.parity.decisive``), at the agreement its
    quantization was accepted with (recorded in the manifest)."""
    top_ids, top_logits = np.asarray(entry.golden["top_ids"]), np.asarray(entry.golden["top_logits"])
    sure = decisive(top_logits)
    agree = float((logits.argmax(-1) == top_ids[:, 0])[sure].mean()) if sure.any() else 1.0
    need = entry.quantization["parity"]["min_top1_agreement"]
    return Check(name, agree >= need, f"int{entry.quantization['bits']}: top-1 agrees with PyTorch's at {agree:.2f} "
                 f"of {int(sure.sum())} decisive positions (min {need}, {provider})",
                 {"top1_agreement": agree, "decisive_positions": int(sure.sum()), "min": need})


def row_count_tie(gen: SpeculativeGenerator, ids: list[int], a: int, b: int, max_rows: int
                  ) -> tuple[bool, float, float]:
    """Whether tokens ``a`` and ``b`` are tied at the position after ``ids`` within what the target's own
    numerics move by pass shape. Quantized kernels (MatMulNBits' int8 activations) round a row differently
    by the rows beside it (and a cache built by multi-row passes holds other roundings than one built a row
    at a time), so at a near-tie plain decoding and a verify pass can each pick a different token, both
    the target's. The next logits are computed with the last r = 1 .. ``max_rows`` tokens fed as one pass;
    returns (tied: some shape ranks b first, or the one-row gap l[a] - l[b] is within the largest change
    of any logit between shapes; that gap; that change). On fp32 graphs the change is ~1e-5: only exact
    ties pass."""
    dec = gen.decoders["target"]
    n = len(ids)
    tokens = np.asarray(ids, np.int64)
    rows_logits = []
    for rows in range(1, min(max_rows, n) + 1):
        cache, past = dec.new_cache(n), n - rows
        if past:
            dec.forward(cache, tokens[:past], np.arange(past), causal_mask(past, 0))
            cache.advance(past)
        logits = dec.forward(cache, tokens[past:], np.arange(past, n), causal_mask(rows, past)).logits
        if logits is None:  # left on a device: not read back for this
            return False, float("nan"), float("nan")
        rows_logits.append(logits[-1].astype(np.float64))
    shapes = np.stack(rows_logits)
    gap = float(shapes[0, a] - shapes[0, b])
    noise = float(np.abs(shapes - shapes[0]).max())
    return bool((shapes[:, a] <= shapes[:, b]).any()) or gap <= noise, gap, noise


def check_greedy(gen: SpeculativeGenerator, method: str, prompts: list[str], max_new_tokens: int,
                 gamma: int, plain: list[list[int]] | None = None, chat: bool = False, row_stable: bool = False
                 ) -> tuple[Check, float | None, float]:
    """Greedy speculation must reproduce plain greedy decoding (``plain``: its ids per prompt, decoded here
    if not given) token for token, both ``row_stable`` if asked (no one-row target pass: quantized kernels
    compute one row differently from several, while multi-row causal passes agree row for row, so a chain
    then matches exactly). A first difference at a near-tie within what pass shapes move the target's own
    logits passes, said (:func:`row_count_tie`; a tree node's attention spans the slots before it, not its
    depth, so trees keep near-ties even row-stable; each output is the target's). Returns
    (check, α, draft pass): α the mean Σmin(p, q) over verified positions (what the theory's α is; accepted /
    drafted undercounts it at γ > 1, where drafts after a rejection count as drafted but never get the
    chance to be accepted), the draft pass the mean seconds of all drafting passes (None: none ran)."""
    bad, ties, alphas, runs = [], [], [], []
    for i, prompt in enumerate(prompts):
        plain_ids = (plain[i] if plain is not None
                     else _generate(gen, prompt, chat, max_new_tokens=max_new_tokens, method="none",
                                    row_stable=row_stable).token_ids)
        spec = _generate(gen, prompt, chat, max_new_tokens=max_new_tokens, method=method, gamma=gamma,
                         row_stable=row_stable)
        if spec.token_ids != plain_ids:
            first = next((j for j, (a, b) in enumerate(zip(spec.token_ids, plain_ids)) if a != b), len(plain_ids))
            tie = None
            if first < min(len(spec.token_ids), len(plain_ids)):
                context = _encode(gen, prompt, chat) + plain_ids[:first]
                tie = row_count_tie(gen, context, plain_ids[first], spec.token_ids[first], gamma + 1)
            if tie is not None and tie[0]:
                ties.append(f"prompt {i} at token {first}: logit gap {tie[1]:.3f}, shapes move logits {tie[2]:.3f}")
            else:
                bad.append(f"prompt {i} differs at token {first}")
        if spec.stats.alpha_estimate is not None:
            alphas.append((spec.stats.alpha_estimate, spec.stats.target_passes - 1))  # weighed by its steps
        runs.append(spec.stats)
    alpha = sum(a * n for a, n in alphas) / sum(n for _, n in alphas) if alphas else None
    same = len(prompts) - len(bad) - len(ties)
    detail = (f"{same}/{len(prompts)} prompts identical to plain decoding"
              + (f"; {len(ties)} first differ at a near-tie, within what pass shapes move the target's own "
                 f"logits (quantized kernels; each output is the target's) ({'; '.join(ties[:3])})" if ties else "")
              + (f" ({'; '.join(bad[:3])})" if bad else ""))
    return (Check(f"greedy {method} == plain", not bad, detail,
                  {"mismatches": len(bad), "row_count_ties": len(ties), "prompts": len(prompts)}),
            alpha, mean_pass_seconds(runs)[1])


def exact_distribution(gen: SpeculativeGenerator, prompt_ids: list[int], tokens: int,
                       sampling: SamplingConfig, one_row: bool = False) -> dict[tuple[int, ...], float]:
    """P(the next ``tokens`` tokens) under the target alone, by enumerating the warped support; no sampling,
    no speculation. Each prefix is one cacheless pass (1 + k + k² + ... passes at top-k k), or, ``one_row``,
    one row per pass from the prompt's last token on, after the prompt's prefill (plain decoding's shapes)."""
    dec = gen.decoders["target"]
    if not one_row:
        dist = {(): 1.0}
        for _ in range(tokens):
            grown = {}
            for seq, pr in dist.items():
                ids = np.asarray(prompt_ids + list(seq), np.int64)
                logits = dec.forward(dec.new_cache(len(ids)), ids, np.arange(len(ids)),
                                     causal_mask(len(ids), 0)).logits
                p = probs_from_logits(logits[-1:], sampling)[0]
                grown.update(((*seq, int(t)), pr * float(p[t])) for t in np.flatnonzero(p))
            dist = grown
        return dist
    start = len(prompt_ids) - 1
    cache = dec.new_cache(start + 1 + tokens)
    dec.forward(cache, np.asarray(prompt_ids, np.int64), np.arange(start + 1), causal_mask(start + 1, 0))
    cache.advance(start + 1)
    dist: dict[tuple[int, ...], float] = {}

    def walk(seq: tuple[int, ...], pr: float, token: int) -> None:
        at = start + len(seq)  # this row's position; the cache holds prompt + seq before it
        cache.truncate(at)
        logits = dec.forward(cache, np.asarray([token], np.int64), np.array([at]), causal_mask(1, at)).logits
        cache.advance(1)
        p = probs_from_logits(logits[-1:], sampling)[0]
        for t in np.flatnonzero(p):
            if len(seq) + 1 == tokens:
                dist[(*seq, int(t))] = pr * float(p[t])
            else:
                walk((*seq, int(t)), pr * float(p[t]), int(t))

    walk((), 1.0, prompt_ids[-1])
    return dist


def total_variation(a: dict[tuple[int, ...], float], b: dict[tuple[int, ...], float]) -> float:
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in a.keys() | b.keys())


def compare_to_exact(name: str, counts: Counter, exact: dict[tuple[int, ...], float], note: str,
                     slack: float = 0.0) -> Check:
    """Total-variation distance between ``counts`` (n draws) and the exact distribution. With K outcomes,
    E[TV(empirical, p)] <= 0.5 sqrt(K/n); the check fails above 1.5 times that bound, plus ``slack``: how
    far the target's own distribution moves with the shapes of the passes that compute it (0 where its
    numerics do not depend on them)."""
    n = sum(counts.values())
    outcomes = counts.keys() | exact.keys()
    tv = total_variation({k: v / n for k, v in counts.items()}, exact)
    threshold = 0.75 * float(np.sqrt(len(outcomes) / n)) + slack
    moved = (f", of which {slack:.3f} is what pass shapes alone move the target's distribution (quantized "
             "kernels)" if slack >= 0.0005 else "")
    return Check(name, tv <= threshold,
                 f"TV distance {tv:.3f} from the target's exact distribution over {n} samples of {note} "
                 f"(threshold {threshold:.3f} for {len(outcomes)} outcomes{moved})",
                 {"tv": tv, "threshold": threshold, "outcomes": len(outcomes), "samples": n, "shape_tv": slack})


def check_sampling(gen: SpeculativeGenerator, method: str, prompt: str, samples: int, gamma: int,
                   tokens: int = 4, top_k: int = 2, on_sample: Callable[[int], None] | None = None,
                   chat: bool = False) -> Check:
    """Sampled speculation vs the target's exact distribution of the first ``tokens`` generated tokens (after
    the first, all go through draft → verify → accept), enumerated from the target alone; top-k keeps the
    support small: at most top_k^tokens sequences. Against the exact side, n samples test as tightly as 4n
    would against a second empirical sample, at a quarter of the generations."""
    sampling = SamplingConfig(temperature=1.0, top_k=top_k)
    ids = _encode(gen, prompt, chat)
    # Quantized kernels compute a one-row pass differently from a pass of two rows or more (MatMulNBits int8:
    # logits up to 0.7 apart; any two multi-row passes agree per row), and a draw's passes are mostly
    # multi-row: how far one-row passes move the target's distribution widens the threshold (~0 at fp32).
    exact = exact_distribution(gen, ids, tokens, sampling)
    shapes = total_variation(exact, exact_distribution(gen, ids, tokens, sampling, one_row=True))
    counts: Counter = Counter()
    # The draws share the prompt's K/V, prefilled by the first; each later one feeds only the prompt's last
    # two tokens (SmolLM2 int8: 20 against 150 ms) and computes the first token as a prefill would.
    reuse, gen.reuse_prefix = gen.reuse_prefix, True
    try:
        for seed in range(samples):
            counts[tuple(_generate(gen, prompt, chat, max_new_tokens=tokens, method=method, gamma=gamma,
                                      temperature=1.0, top_k=top_k, seed=seed).token_ids)] += 1
            if on_sample:
                on_sample(seed + 1)  # draws done
    finally:
        gen.reuse_prefix = reuse
    return compare_to_exact(f"sampled {method} ~ target", counts, exact,
                            f"the first {tokens} tokens; temperature 1, top-k {top_k}", slack=shapes)


def draft_cost_ratio(draft_pass_s: float | None, plain_results: Sequence) -> float:
    """c: a drafting pass's mean seconds over plain decoding's mean one-row pass (its runs' ``stats``, after
    prefill), the ratio ``specrt bench`` reports; 0 where nothing was drafted or timed."""
    plain_pass_s = mean_pass_seconds([r.stats for r in plain_results])[0]
    return draft_pass_s / plain_pass_s if draft_pass_s and plain_pass_s > 0 else 0.0


def check_draft_pays(alpha: float | None, c: float, method: str = "draft", max_gamma: int = 16,
                     verify_costs: Sequence[float] | None = None) -> Check:
    """A draft whose best predicted speedup is below 1 is broken or useless (e.g. shifted vocabulary).
    ``c``: a draft pass over a one-row target pass; ``verify_costs``: the backend's measured cost of a
    target pass over 1, 2, ... rows (None: the paper's, every pass one row's time), which on a quantized
    CPU target can keep a sound draft from paying."""
    name = "EAGLE-3 head pays for itself" if method == "eagle" else "draft pays for itself"
    if alpha is None:
        return Check(name, False, "no draft tokens were proposed")
    g = theory.optimal_gamma(alpha, c, max_gamma, verify_costs)
    best = theory.speedup(alpha, g, c, verify_costs)
    paper = theory.speedup(alpha, theory.optimal_gamma(alpha, c, max_gamma), c)
    v = theory.verify_cost_at(verify_costs, g + 1)
    if best > 1.0:
        why = ""
    elif paper > 1.0:
        why = (f" — it would pay {paper:.2f}x if verifying γ+1 rows cost one row's time; on this backend "
               f"{g + 1} rows cost {v:.2f}x one (a quantized target on a CPU?): the draft is sound, the target's "
               "multi-row passes are dear")
    else:
        why = " — the draft is too slow (c) or too often rejected (α: wrong model or vocabulary?) to help"
    cost = f", verify cost v({g + 1}) {v:.2f}" if verify_costs else ""
    return Check(name, best > 1.0, f"greedy α {alpha:.3f}, c {c:.3f}{cost}: best predicted speedup {best:.2f}x "
                                   f"at γ = {g}" + why,
                 {"alpha": alpha, "c": c, "best_gamma": g, "best_speedup": best, "paper_speedup": paper})


def verify_bundle(gen: SpeculativeGenerator, prompts: list[str], samples: int = 500, max_new_tokens: int = 32,
                  gamma: int = 4, on_progress: Callable[[str, int, int], None] | None = None,
                  chat: bool = False) -> Iterator[Check]:
    """The checks one by one, each as soon as it is decided; ``on_progress(what, done, total)`` while the
    sampled check draws. ``chat``: each prompt is a user's message in the bundle's chat template (what an
    instruct model, and a head trained on its replies, are for)."""
    # An EAGLE-3 head's graph was checked against PyTorch at export; on this backend it is checked by what
    # it must never change (greedy == plain, sampling ~ the target) and whether it pays.
    for role, entry in gen.manifest.models.items():
        if entry.kind == "decoder":
            yield check_golden(gen, role)
    head = gen.manifest.eagle is not None
    trees = ["eagle-tree"] if head and gen.manifest.runs_trees else []  # a causal-only graph verifies no trees
    methods = ((["eagle", *trees] if head else []) + (["dflash"] if gen.manifest.dflash is not None else [])
               + (["draft"] if gen.manifest.draft is not None else []) + ["ngram"])
    plain: dict[bool, list] = {}  # plain decoding's results per prompt, by row_stable

    def plain_runs(stable: bool) -> list:
        if stable not in plain:
            plain[stable] = [_generate(gen, p, chat, max_new_tokens=max_new_tokens, method="none", row_stable=stable)
                             for p in prompts]
        return plain[stable]

    for method in methods:
        stable = not proposes_trees(method)  # a chain then matches plain decoding exactly (check_greedy)
        greedy, alpha, draft_pass = check_greedy(gen, method, prompts, max_new_tokens, gamma,
                                                 [r.token_ids for r in plain_runs(stable)], chat, stable)
        yield greedy
        if method in ("draft", "eagle"):
            # c as `specrt bench` takes it: a draft pass over a one-row plain pass, both timed in the loop alike
            # (a verify pass's in-loop time over the engine-only curve v(γ+1) made a same-size draft look cheap).
            yield check_draft_pays(alpha, draft_cost_ratio(draft_pass, plain_runs(False)), method,
                                   verify_costs=gen.verify_costs())
    for method in methods[:1 + len(trees)]:  # the chain, and the tree's point-mass acceptance where it runs
        step = (lambda done, m=method: on_progress(f"sampling {m}", done, samples)) if on_progress else None
        yield check_sampling(gen, method, prompts[0], samples, gamma, on_sample=step, chat=chat)
