"""``specrt plan``: which γ to use, from α and c given or measured on a bundle."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import theory
from ..errors import ConfigError


@dataclass(frozen=True)
class PlanRow:
    gamma: int
    expected_tokens: float  # per target pass
    relative_cost: float  # γc + 1, in target passes
    speedup: float
    ops_factor: float  # arithmetic operations vs plain decoding (Leviathan et al. Eq. 11)


def parse_verify_costs(text: str) -> tuple[float, ...]:
    """``--verify-costs 1,1.21,1.57``: v(1), v(2), ... as floats, v(1) = 1 and never falling."""
    try:
        costs = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"--verify-costs must be numbers like 1,1.2,1.5 (a pass over 1, 2, 3 rows against one), "
                          f"got {text!r}") from None
    if not costs or costs[0] != 1.0 or any(b < a for a, b in zip(costs, costs[1:])):
        raise ConfigError(f"--verify-costs must start at 1 (one row against itself) and never fall, got {text!r}")
    return costs


def plan_table(alpha: float, c: float, max_gamma: int = 16, mu: float | None = None,
               verify_costs: tuple[float, ...] | None = None, one_pass: bool = False) -> list[PlanRow]:
    """One row per γ in [1, max_gamma]. ``mu``: draft / target arithmetic per token for the ops factor
    [default: c, a time ratio standing in for it]; ``verify_costs``: v(r) (theory.verify_cost_at) [default: 1];
    ``one_pass``: the drafter proposes γ tokens in one pass (DFlash), so a step costs c + v(γ+1)."""
    mu = c if mu is None else mu
    if not 0 <= alpha <= 1:
        raise ConfigError(f"alpha must be in [0, 1], got {alpha}")
    if c < 0:
        raise ConfigError(f"c must be >= 0, got {c}")
    if mu < 0:
        raise ConfigError(f"mu must be >= 0, got {mu}")
    if not 1 <= max_gamma <= 64:
        raise ConfigError(f"max gamma must be in [1, 64], got {max_gamma}")
    return [PlanRow(g, theory.expected_tokens(alpha, g),
                    (1 if one_pass else g) * c + theory.verify_cost_at(verify_costs, g + 1),
                    theory.speedup(alpha, g, c, verify_costs, one_pass), theory.ops_factor(alpha, g, mu))
            for g in range(1, max_gamma + 1)]


def oracle_line(alpha: float, row: PlanRow) -> str:
    """How close a γ's expected tokens per pass come to the unlimited-γ ceiling 1 / (1 - α)."""
    ceiling = theory.oracle_tokens(alpha)
    if ceiling == float("inf"):
        return "oracle ceiling (γ → ∞): unbounded at α = 1; every drafted token is accepted"
    return (f"oracle ceiling (γ → ∞): {ceiling:.2f} tokens per target pass; γ = {row.gamma} reaches "
            f"{row.expected_tokens:.2f}, {row.expected_tokens / ceiling:.0%} of it")


def stand_in_note(c: float) -> str:
    """What the ops-factor column means when no μ was given or measured."""
    return f"μ = c = {c:.3f}: a time ratio standing in for the ops ratio (give --mu, or --bundle)"


def drafting_method(manifest) -> str:
    """The chain method ``plan`` measures: the bundle's EAGLE-3 head, else its DFlash draft, else its draft model,
    else prompt lookup (ngram), which every bundle can run."""
    if manifest.eagle is not None:
        return "eagle"
    if manifest.dflash is not None:
        return "dflash"
    if manifest.draft is not None:
        return "draft"
    return "ngram"


def bundle_mu(bundle: str | Path, manifest, context: int = 256) -> tuple[float, str]:
    """μ of a bundle's drafter (its EAGLE-3 head, else its draft model): drafter / target matmul FLOPs per token
    from the graphs (manifest figures, else read with onnx, else estimated), plus attention at ``context``
    positions from the manifest dims; and a line saying where it came from."""
    from . import roofline

    if context < 0:
        raise ConfigError(f"context must be >= 0, got {context}")
    method = drafting_method(manifest)
    if method == "ngram":
        return 0.0, "μ = 0: prompt lookup drafts by matching the context, with no model arithmetic"
    drafter = {"eagle": manifest.eagle, "dflash": manifest.dflash}.get(method, manifest.draft)
    t, d = roofline.entry_cost(bundle, manifest.target), roofline.entry_cost(bundle, drafter)
    mu = roofline.mu(d, t, drafter.dims, manifest.target.dims, context)
    sources = " and ".join(sorted({t.source, d.source}))
    return mu, (f"μ = {mu:.4f}: {'head' if drafter is manifest.eagle else 'draft'} / target matmul FLOPs per token ({d.matmul_flops_per_token / 1e6:.1f}M / "
                f"{t.matmul_flops_per_token / 1e6:.1f}M, {sources})"
                + (f" + attention at context {context}" if context else ""))


@dataclass(frozen=True)
class Measurement:
    alpha: float  # mean Σmin(p, q) over verified prefixes
    acceptance_rate: float  # accepted / drafted
    c: float  # draft pass time / plain target decode pass time (as bench reports it)
    temperature: float
    prompts: int
    method: str = "draft"

    @property
    def one_pass(self) -> bool:
        """Whether the method drafts its γ tokens in one pass (Drafter.drafts_in_one_pass: DFlash)."""
        from ..runtime.drafters import drafter_class

        return drafter_class(self.method).drafts_in_one_pass

    def describe(self) -> str:
        return (f"{self.method} measured on {self.prompts} prompts at temperature {self.temperature:g}: "
                f"α = {self.alpha:.3f} (accepted/drafted {self.acceptance_rate:.3f}), c = {self.c:.3f}"
                + ("; prompt lookup, the one drafter of a bundle without a head or draft model (α over the steps "
                   "whose lookup matched)" if self.method == "ngram" else ""))


def measure(gen, prompts: list[str], temperature: float = 1.0, gamma: int = 4, max_new_tokens: int = 64,
            seed: int = 0, chat: bool = False) -> Measurement:
    """α and c of a bundle's drafter (its EAGLE-3 head, else its draft model) on this backend, measured as
    ``specrt bench`` measures them (α: mean Σmin(p, q) over verified prefixes, as Leviathan et al. estimate it;
    c: draft pass / plain target pass). ``chat``: each prompt a user's message, in the chat template."""
    from .bench import BenchConfig, run_bench

    method = drafting_method(gen.manifest)
    cfg = BenchConfig(methods=("none", method), max_new_tokens=max_new_tokens, repeats=1, gamma=gamma,
                      temperature=temperature, seed=seed, chat=chat)
    row = run_bench(gen, prompts, cfg)["methods"][method]
    if row["alpha"] is None:  # prompt lookup that never found a match: nothing was drafted
        raise ConfigError(f"{method} drafted nothing on these {len(prompts)} prompts (no n-gram of the context "
                          "recurred): no α to plan with; try prompts that repeat their context, or give --alpha/--c")
    return Measurement(alpha=row["alpha"], acceptance_rate=row["acceptance_rate"], c=row["c"],
                       temperature=temperature, prompts=len(prompts), method=method)


def plot(alpha: float, c: float, max_gamma: int, path: str | Path,
         verify_costs: tuple[float, ...] | None = None, one_pass: bool = False) -> Path:
    """Speedup vs γ at this α for the given c and a few others, as a PNG (needs matplotlib); ``one_pass``: as
    :func:`plan_table`'s."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'specrt[plot]'") from None
    gammas = list(range(1, max_gamma + 1))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for cc in sorted({c, 0.01, 0.05, 0.1, 0.2, 0.5}):
        ys = [theory.speedup(alpha, g, cc, verify_costs, one_pass) for g in gammas]
        ax.plot(gammas, ys, marker="o", ms=3, lw=2.5 if cc == c else 1, label=f"c = {cc:g}" + (" (yours)" if cc == c else ""))
    best = theory.optimal_gamma(alpha, c, max_gamma, verify_costs, one_pass)
    ax.axvline(best, color="grey", ls=":", lw=1)
    ax.axhline(1.0, color="black", lw=0.5)
    ax.set(xlabel="γ (drafted tokens per target pass)", ylabel="speedup over plain decoding",
           title=f"Speculative decoding at α = {alpha:.2f}: optimal γ = {best} for c = {c:g}")
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
