"""Commands that measure and check: bench, plan, verify, doctor."""

from __future__ import annotations

import dataclasses
import json

import click

from . import main
from ..runtime.options import check_temperature
from .options import (
    backend_option,
    bundle_option,
    chat_for,
    chat_option,
    checked,
    measure_prompts,
    gamma_option,
    low_memory_option,
    sampling_options,
    threads_option,
    tree_option,
)


@main.command()
@bundle_option
@click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False),
              help="JSON list or one-prompt-per-line file [default: 8 of the shipped chat prompts with --chat, "
                   "else the 8 code prompts].")
@click.option("--prompt-set", type=click.Choice(["code", "prose", "all", "chat"]),
              help="Which shipped prompt set to use when --prompts is not given (chat: all 210) [default: 8 "
                   "chat prompts with --chat, else code].")
@chat_option("Each prompt is a user's message to an instruct model, rendered with the bundle's chat template.")
@click.option("--methods", help="Comma-separated; must include none [default: none and every method the bundle "
                               "holds: eagle and eagle-tree, dflash, draft and tree where it has a head, a DFlash "
                               "draft or a draft model, and ngram]. NAME@GAMMA gives one entry its own γ "
                               "(none,eagle@1,eagle@2,eagle@auto,dflash@7).")
@tree_option
@click.option("--max-new-tokens", type=int, default=128, show_default=True)
@click.option("--repeats", type=int, default=3, show_default=True, help="Figures are medians over repeats.")
@gamma_option
@sampling_options
@click.option("--greedy-baseline/--no-greedy-baseline", default=True, show_default=True,
              help="With sampling: also run greedy plain decoding in every repeat, beside the sampled none run, "
                   "and report each method's tokens/s over it (what sampling costs, measured in one run).")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), help="Also write the results here.")
@threads_option
@click.option("--compare", "compare", multiple=True, metavar="PEERS",
              help="Also time peers on the same checkpoints, prompts and sampling settings, interleaved with "
                   "specrt's methods: hf (Hugging Face generate and assisted generation; needs torch), ortgenai "
                   "(ONNX Runtime GenAI plain decoding; needs the [peers] extra), llamacpp (llama.cpp plain and "
                   "prompt-lookup decoding on a GGUF; needs the [llamacpp] extra). Comma-separated or repeated.")
@click.option("--hf-target", type=click.Path(file_okay=False),
              help="HF checkpoint of the target for --compare [default: the manifest's source].")
@click.option("--hf-draft", type=click.Path(file_okay=False),
              help="HF checkpoint of the draft for --compare hf [default: the manifest's source].")
@click.option("--peer-precision", type=click.Choice(["fp32", "int8", "int4"]),
              help="Precision ONNX Runtime GenAI's builder makes [default: the bundle's; fp16 bundles get fp32, "
                   "the builder has no fp16 for CPU].")
@click.option("--peer-gguf", type=click.Path(dir_okay=False),
              help="GGUF for --compare llamacpp [default: the bundle's source, when it was exported from one].")
@click.option("--peer-cache", type=click.Path(file_okay=False),
              help="Where built ONNX Runtime GenAI models are kept [default: ~/.cache/specrt/peers].")
@click.option("--roofline", is_flag=True,
              help="Probe the memory bandwidth first (about a second: the GPU's with torch+CUDA for GPU backends, "
                   "else host memory) and report per method the GB/s achieved, its share of that roofline, and "
                   "the tokens/s the roofline allows.")
@click.option("--bandwidth", "bandwidth_gbps", type=float, metavar="GBPS",
              help="Use this bandwidth (GB/s) as the roofline instead of probing: a datasheet figure, or "
                   "`specrt doctor --bandwidth`'s.")
@click.option("--energy", is_flag=True,
              help="Joules per token and tokens per joule per method, from Jetson power monitors, RAPL or NVML "
                   "(whichever this machine reports; which are missing is said, not an error).")
@click.option("--interleave/--blocks", default=True, show_default=True,
              help="interleave: each prompt runs every method (order rotating by prompt) before the next prompt, "
                   "so a machine whose speed drifts during the run weighs on every method alike; blocks: each "
                   "method over every prompt in turn (--energy meters blocks).")
@low_memory_option
@backend_option
def bench(bundle: str | None, prompts_file: str | None, prompt_set: str | None, chat: bool | None,
          methods: str | None,
          tree_shape: str, eagle_tree: str,
          max_new_tokens: int, repeats: int, gamma: int | str, draft_stop: float, row_stable: bool, temperature: float,
          top_k: int,
          top_p: float,
          greedy_baseline: bool, json_out: str | None, threads: int | None, thread_pool: str, compare: tuple[str, ...],
          hf_target: str | None, hf_draft: str | None, peer_precision: str | None, peer_gguf: str | None,
          peer_cache: str | None, roofline: bool, bandwidth_gbps: float | None, energy: bool, interleave: bool,
          low_memory: bool | None, backend: str) -> None:
    """Measure tokens/s per method in one run; speedups are ratios to --method none.

    Also reports tokens per target pass, alpha, c, the speedup the theory predicts for them, the time split (draft /
    verify / prefill / host), the host work per generated token (everything outside the engines' run calls, a
    backend's binding included) and, for greedy runs, whether every method produced the same tokens as plain
    decoding; for sampled runs, every method's tokens/s over greedy plain decoding's, run beside it in each repeat. Sampling settings apply to every
    method alike, and to the peers of --compare, which decode from specrt's prompt ids; each method's tokens/s is
    reported over each peer's. ONNX Runtime GenAI's model is built once per checkpoint, precision and version, then
    cached.

    Every method also gets its bytes read per generated token (weights of each graph at its precision, plus the KV
    cache at the measured mean context, times the measured target and draft passes per token) and its arithmetic per
    token against plain decoding (ops factor). Decoding at batch 1 is memory-bound: --roofline divides the measured
    bandwidth by those bytes to say how far each method is from the limit.

    \b
    Examples:
      specrt bench --bundle bundle --methods none,draft,ngram --repeats 3 --json bench.json
      specrt bench --bundle bundle --methods none,draft --temperature 0.8 --top-p 0.9
      specrt bench --bundle bundle --methods none,draft --roofline --energy
      specrt bench --bundle bundle --bandwidth 204.8          # Jetson AGX Orin's LPDDR5, from the datasheet
      specrt bench --bundle bundle-int4 --compare ortgenai,hf
      specrt bench --bundle smollm2-q41 --chat --compare llamacpp      # a bundle exported from a GGUF
      specrt bench --bundle smollm2 --chat --prompts benchmarks/prompts/chat-heldout.json --methods none,eagle
      specrt bench --bundle smollm2 --backend torch --methods none,eagle-tree   # PyTorch, CUDA graphs on a GPU
    """
    from .. import load
    from ..data import prompts as builtin_prompts
    from ..measure.bandwidth import Bandwidth
    from ..measure.bench import BenchConfig, bench_notes, default_methods, read_prompts
    from ..measure.peers import parse_kinds
    from ..measure.report import print_bench
    from ..runtime.tree import DynamicTree, TreeShape

    kinds = parse_kinds(compare)
    options = dict(max_new_tokens=max_new_tokens, repeats=repeats, gamma=gamma, draft_stop=draft_stop,
                   row_stable=row_stable, temperature=temperature, top_k=top_k, top_p=top_p,
                   tree=TreeShape.parse(tree_shape), eagle_tree=DynamicTree.parse(eagle_tree),
                   greedy_baseline=greedy_baseline, interleave=interleave)
    if methods is not None:  # checked before loading; the default needs the bundle
        cfg = BenchConfig(methods=tuple(m.strip() for m in methods.split(",") if m.strip()), **options)
    prompts = read_prompts(prompts_file) if prompts_file else None
    given = Bandwidth("given", bandwidth_gbps) if bandwidth_gbps is not None else None  # checks it before loading
    gen = load(bundle, backend=backend, threads=threads, low_memory=low_memory, shared_threads=thread_pool == "shared")
    options["chat"] = chat = chat_for(gen, chat)
    if methods is not None:
        cfg = dataclasses.replace(cfg, chat=chat)
    if prompts is None:
        prompts = builtin_prompts(prompt_set) if prompt_set else measure_prompts(chat)
    if methods is None:
        cfg = BenchConfig(methods=default_methods(gen), **options)
    notes = bench_notes(gen)
    peer_options = dict(hf_target=hf_target, hf_draft=hf_draft, threads=threads, peer_precision=peer_precision,
                        peer_cache=peer_cache, peer_gguf=peer_gguf)
    result = _bench_with_status(gen, prompts, cfg, notes, kinds, peer_options, roofline, given, energy)
    result["notes"] = notes
    print_bench(result)
    if json_out:
        with open(json_out, "w") as f:
            json.dump(result, f, indent=2)
        click.echo(f"wrote {json_out}")


def _bench_with_status(gen, prompts: list[str], cfg, notes: list[str], kinds: tuple[str, ...], peer_options: dict,
                       roofline: bool, given, energy: bool) -> dict:
    """``specrt bench``'s measuring, under a status line on stderr: the peers (built first where they need it),
    the bandwidth (given, or probed with --roofline), the energy meter (--energy), then the run. Why a probe
    or a meter could not run goes into ``notes``."""
    from rich.console import Console

    from ..measure.bench import make_peers, run_bench
    from ..measure.probes import energy_meter, roofline_bandwidth

    with Console(stderr=True).status("loading peers…" if kinds else "benchmarking…") as status:
        peers = make_peers(gen, kinds, **peer_options,
                           on_progress=lambda msg: status.update(f"building ONNX Runtime GenAI model: {msg}"))
        provider = gen.decoders["target"].provider
        bw = given or (roofline_bandwidth(provider, notes, status.update) if roofline else None)
        meter = energy_meter(notes) if energy else None
        return run_bench(gen, prompts, cfg, on_progress=lambda msg: status.update(f"benchmarking: {msg}"),
                         peers=peers, bandwidth=bw, energy=meter)


@main.command()
@click.option("--alpha", type=float, help="Acceptance rate α in [0, 1].")
@click.option("--c", "c", type=float, help="Cost of a draft pass / cost of a target pass.")
@click.option("--mu", type=float,
              help="Draft / target arithmetic operations per token, for the ops-factor column [default: from the "
                   "bundle's graphs with --bundle; else c, a time ratio standing in for it].")
@click.option("--bundle", type=click.Path(file_okay=False),
              help="Measure α and c of the bundle's EAGLE-3 head, else its draft model, else prompt lookup (ngram) "
                   "first (instead of --alpha/--c), and μ from its graphs.")
@chat_option("With --bundle: each prompt is a user's message in the bundle's chat template (an instruct model's "
             "replies; default prompts then: 8 of the shipped chat prompts).")
@click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False),
              help="With --bundle: measure on these prompts (JSON list or one per line) [default: the shipped code "
                   "prompts]. A head trained on the shipped prompts reads optimistic α from them: pass held-out ones.")
@click.option("--demo", is_flag=True, help="Measure on the demo bundle shipped with specrt.")
@click.option("--temperature", type=float, default=1.0, show_default=True, callback=checked(check_temperature),
              help="Sampling temperature to measure α at (0-2).")
@click.option("--context", type=int, default=256, show_default=True,
              help="With --bundle: μ adds attention's FLOPs at this many positions (0: matmuls only).")
@click.option("--max-gamma", type=int, default=16, show_default=True)
@click.option("--verify-costs", "verify_costs", metavar="V1,V2,...",
              help="A target pass over 1, 2, ... rows against one row (e.g. 1,1.21,1.57,1.71: an int8 bundle on a "
                   "CPU; benchmarks/verify-cost/verify_cost.py prints them): γ pays v(γ+1), not 1 [default: measured on this "
                   "backend with --bundle; else 1 for every row count, the paper's memory-bound pass].")
@click.option("--plot", "plot_file", type=click.Path(dir_okay=False),
              help="Write a PNG of speedup vs γ (needs matplotlib).")
@threads_option
def plan(alpha: float | None, c: float | None, mu: float | None, bundle: str | None, chat: bool | None,
         prompts_file: str | None, demo: bool, temperature: float, context: int, max_gamma: int,
         verify_costs: str | None, plot_file: str | None, threads: int | None, thread_pool: str) -> None:
    """Table of γ, E[tokens per target pass], relative cost γc+v(γ+1), speedup and arithmetic-ops factor; marks
    the optimal γ and says how close it gets to the unlimited-γ ceiling.

    \b
    E[tokens/pass] = (1 - α^(γ+1)) / (1 - α)     speedup = E / (γc + v(γ+1))
    v(r)           = a pass over r rows / one row (1 when memory-bound; more on CPUs and quantized kernels)
    ops factor     = (γμ + γ + 1) / E             (Leviathan et al. 2023, Eq. 11)
    oracle ceiling = 1 / (1 - α)                  (E as γ → ∞)

    The ops factor is how many times plain decoding's arithmetic speculation spends: it is paid in compute (and
    energy) even where the memory-bound wall time improves.

    \b
    Examples:
      specrt plan --alpha 0.8 --c 0.02 --mu 0.01
      specrt plan --bundle bundle --temperature 0 --context 1024 --plot speedup.png
      specrt plan --bundle smollm2-eagle --chat --prompts benchmarks/prompts/chat-heldout.json --temperature 0
    """
    from ..measure.plan import bundle_mu, measure, parse_verify_costs, plot
    from ..measure.report import print_plan

    mu_note = measured_at = None
    one_pass = False
    costs = parse_verify_costs(verify_costs) if verify_costs else None
    if bundle is not None or demo:
        if alpha is not None or c is not None:
            raise click.UsageError("give either --alpha/--c or --bundle, not both")
        from .. import load
        from ..measure.bench import read_prompts

        gen = load(bundle, threads=threads, shared_threads=thread_pool == "shared")  # c depends on the pool
        chat = chat_for(gen, chat)
        prompts = read_prompts(prompts_file) if prompts_file else measure_prompts(chat)
        m = measure(gen, prompts, temperature=temperature, chat=chat)
        alpha, c, one_pass = m.alpha, m.c, m.one_pass
        measured_at = "greedy" if not temperature else f"at T {temperature:g}"
        click.echo(m.describe())
        if costs is None:
            costs = gen.verify_costs()
            click.echo(f"verify cost v(1..{len(costs)}) on this backend: " + ", ".join(f"{v:.2f}" for v in costs))
        if mu is None:
            mu, mu_note = bundle_mu(gen.bundle, gen.manifest, context)
    elif alpha is None or c is None:
        raise click.UsageError("give --alpha and --c, or --bundle to measure them")
    print_plan(alpha, c, max_gamma, mu, mu_note, costs, measured_at, one_pass)
    if plot_file:
        click.echo(f"wrote {plot(alpha, c, max_gamma, plot_file, costs, one_pass)}")


@main.command()
@bundle_option
@click.option("--samples", type=int, default=500, show_default=True,
              help="Sampled generations per sampled-distribution check, compared with the target's exact "
                   "distribution (enumerated, not sampled): 500 test as tightly as 2000 per side compared with "
                   "a second sample would.")
@click.option("--max-new-tokens", type=int, default=32, show_default=True)
@click.option("--prompt-set", type=click.Choice(["code", "prose", "all", "chat"]),
              help="chat: 12 of the shipped chat prompts as user messages in the bundle's chat template (instruct "
                   "models, and heads trained on their replies) [default: chat when the bundle has a chat "
                   "template, else all].")
@backend_option
@threads_option
def verify(bundle: str | None, samples: int, max_new_tokens: int, prompt_set: str | None, backend: str,
           threads: int | None,
           thread_pool: str) -> None:
    """Check a bundle on this backend: PASS/FAIL with figures, exit code 1 on any FAIL.

    \b
    - logits vs the PyTorch reference stored at export (precision problems, broken engines);
    - greedy speculation == plain greedy decoding, token for token (EAGLE-3 chain and tree, draft, n-gram);
      a first difference at a near-tie within what pass shapes move the target's own logits (int8/int4
      kernels round a row by the rows beside it) passes, and is counted and shown;
    - sampled speculation vs the target's exact distribution of the first tokens (enumerated from the target
      alone), total-variation distance under a stated threshold, widened by how far one-row passes alone move
      that distribution on a quantized target (shown): the EAGLE-3 chain and tree, else the draft; the draws
      share the prompt's K/V;
    - the draft pays for itself: best predicted speedup at the measured α and c (a draft pass over a plain
      one-row pass, both timed in the loop, as bench reports it) above 1, with what this
      backend's verify passes cost by row count (a draft with a shifted vocabulary cannot change the
      output, only this figure; a sound one can still lose to dear multi-row passes, and it says so).
    Each line prints as its check ends; a bar shows the sampled checks' draws.
    """
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    from .. import load
    from ..check.verify import verify_bundle
    from ..data import prompts as builtin_prompts

    if samples < 10:
        raise click.BadParameter("use at least 10 samples", param_hint="--samples")
    gen = load(bundle, backend=backend, threads=threads, shared_threads=thread_pool == "shared")
    checks = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        tasks: dict[str, int] = {}

        def on_progress(what: str, done: int, total: int) -> None:
            if what not in tasks:
                tasks[what] = bar.add_task(what, total=total)
            bar.update(tasks[what], completed=done)

        prompt_set = prompt_set or ("chat" if chat_for(gen, None) else "all")
        chat = prompt_set == "chat"
        prompts = builtin_prompts("chat")[-12:] if chat else builtin_prompts(prompt_set)
        for ch in verify_bundle(gen, prompts, samples=samples, max_new_tokens=max_new_tokens,
                                on_progress=on_progress, chat=chat):
            checks.append(ch)
            click.echo(f"{'PASS' if ch.passed else 'FAIL'}  {ch.name}: {ch.detail}")  # above the bar (rich)
    failed = [ch for ch in checks if not ch.passed]
    if failed:
        raise click.ClickException(f"{len(failed)} of {len(checks)} checks failed")
    click.echo(f"all {len(checks)} checks passed")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--bandwidth", is_flag=True,
              help="Also measure sustainable memory bandwidth the way STREAM does (about a second): host memory "
                   "(read-sum and copy, one thread per core), and the GPU's with torch+CUDA.")
@click.option("--bandwidth-mb", type=int,
              help="Array size of the probe in MiB [default: max(512, 4x the last-level cache), at most a quarter "
                   "of free memory].")
def doctor(as_json: bool, bandwidth: bool, bandwidth_mb: int | None) -> None:
    """What specrt sees: Python and library versions, ONNX Runtime providers, GPUs, Jetson model / L4T / JetPack /
    power mode, and the backend `specrt run` would pick.

    \b
    Examples:
      specrt doctor
      specrt doctor --bandwidth                 # then: specrt bench --bandwidth <its GB/s>
      specrt doctor --bandwidth --bandwidth-mb 2048 --json
    """
    from ..check.doctor import as_dict, diagnose, render
    from ..measure.probes import bandwidth_probes

    if bandwidth_mb is not None and not bandwidth:
        raise click.UsageError("--bandwidth-mb needs --bandwidth")
    report = diagnose()
    probes = bandwidth_probes(None if bandwidth_mb is None else bandwidth_mb * 2**20) if bandwidth else None
    click.echo(json.dumps(as_dict(report, probes), indent=2) if as_json else render(report, probes))

