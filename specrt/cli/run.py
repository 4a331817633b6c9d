"""Commands that decode: run and serve."""

from __future__ import annotations

import functools
import json

import click

from . import main
from .options import (
    backend_option,
    bundle_option,
    gamma_option,
    load_bundle,
    low_memory_option,
    method_option,
    sampling_options,
    seed_option,
    threads_option,
    tree_option,
)


SLOWER = 0.97  # a measured speedup below this is said to be a loss, not noise


@main.command()
@click.argument("prompt")
@click.option("--chat", is_flag=True,
              help="Chat with an instruct model instead of continuing PROMPT: PROMPT is the user's turn, rendered "
                   "with the bundle's chat template (exported from the tokenizer); the reply streams until the "
                   "model's end-of-turn token. A flag, as in bench, plan and verify.")
@click.option("--system", "system_message", metavar="TEXT",
              help="With --chat: a system message before the user's (not every template accepts one).")
@bundle_option
@method_option()
@click.option("--acceptance", type=click.Choice(["exact", "typical"]), default="exact", show_default=True,
              help="typical: Medusa's typical acceptance for sampling. LOSSY: the output is NOT distributed as "
                   "the target's. Exact is the default and the only lossless choice.")
@tree_option
@gamma_option
@click.option("--max-new-tokens", type=int, default=128, show_default=True)
@sampling_options
@seed_option
@click.option("--stop", multiple=True, help="Stop string (repeatable); the text ends before it.")
@click.option("--stats", is_flag=True, help="Print acceptance, tokens per target pass, c and speedups to stderr.")
@click.option("--baseline", is_flag=True,
              help="With --stats: also decode the prompt with --method none and print the measured speedup.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object (text, token_ids, stats) instead of streaming.")
@backend_option
@threads_option
@low_memory_option
def run(prompt: str, chat: bool, system_message: str | None, bundle: str | None, method: str,
        acceptance: str, tree_shape: str, eagle_tree: str, gamma: int | str, draft_stop: float, row_stable: bool,
        max_new_tokens: int,
        temperature: float, top_k: int,
        top_p: float, seed: int, stop: tuple[str, ...], stats: bool, baseline: bool, as_json: bool, backend: str,
        threads: int | None, thread_pool: str, low_memory: bool | None) -> None:
    """Generate a continuation of PROMPT with exact speculative decoding, streaming it to stdout. With --chat,
    reply to PROMPT as the instruct model's assistant.

    The output is distributed exactly as the target model's own (greedy: identical tokens); the draft only changes
    how many tokens each target pass yields.

    \b
    Examples:
      specrt run "def fib(n):" --bundle bundle --stats --baseline
      specrt run "import os" --bundle bundle --method ngram --temperature 0.8 --top-p 0.95 --seed 1
      specrt run "class Stack:" --bundle bundle --gamma auto --json
      specrt run "def main():" --bundle bundle --method tree --tree 3,2,1,1 --stats
      specrt run --chat "Write a haiku about caches." --system "You are terse." --bundle instruct-bundle
    """
    from ..runtime.options import DecodeOptions

    if system_message is not None and not chat:
        raise click.UsageError("--system needs --chat")
    options = DecodeOptions(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                            seed=seed, method=method, gamma=gamma, stop=stop, tree=tree_shape, acceptance=acceptance,
                            eagle_tree=eagle_tree, draft_stop=draft_stop, row_stable=row_stable)  # checked before loading
    gen = load_bundle(bundle, backend=backend, threads=threads, low_memory=low_memory,
                      shared_threads=thread_pool == "shared")
    if chat:
        messages = ([{"role": "system", "content": system_message}] if system_message is not None else []) + [
            {"role": "user", "content": prompt}]
        stream = functools.partial(gen.stream_chat, messages)
    else:
        stream = functools.partial(gen.stream, prompt)
    pieces = stream(options)
    if as_json:
        result = pieces.result
        click.echo(json.dumps({"text": result.text, "token_ids": result.token_ids,
                               "finish_reason": result.finish_reason, "stats": result.stats.to_dict()}, indent=2))
    else:
        for piece in pieces:
            click.echo(piece, nl=False)
        click.echo()
        result = pieces.result
    if stats:
        from ..measure.report import print_stats

        measured = None
        if baseline and method != "none":
            plain = stream(options.replace(method="none", acceptance="exact")).result  # typical is Medusa's only
            measured = result.stats.tokens_per_second / plain.stats.tokens_per_second
        target = gen.decoders["target"]
        print_stats(result.stats, target.provider, lossy=acceptance == "typical", measured_speedup=measured,
                    graphs=target.graph_status)
        if gen.drafter_note and result.stats.method == "ngram":
            click.echo(f"note: {gen.drafter_note}", err=True)
        if measured is not None and measured < SLOWER:
            click.echo(f"note: {result.stats.method} ran {measured:.2f}x plain decoding here: at these settings the "
                       "drafter does not pay on this machine; --method none is faster for them", err=True)


@main.command()
@bundle_option
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind. The default answers this machine only; 0.0.0.0 opens it to the network "
                   "(then set an API key).")
@click.option("--port", type=int, default=8000, show_default=True)
@method_option("Speculation method for every request. ")
@gamma_option
@tree_option
@click.option("--max-queue", type=int, default=16, show_default=True,
              help="Requests that may wait for the generator besides the one it runs; past that: 429 with "
                   "Retry-After.")
@click.option("--reuse-prefix", is_flag=True,
              help="Keep the last request's context in the caches: a request that starts the same way (a "
                   "conversation re-sent with its new turn, as OpenAI clients do; a shared system prompt) "
                   "feeds only the rest, counted in usage.prompt_tokens_details.cached_tokens. On int8/int4 "
                   "bundles a reply can then differ from a fresh one's at a near-tie (each is the target's).")
@click.option("--api-key", envvar="SPECRT_API_KEY", show_envvar=True,
              help="Require 'Authorization: Bearer KEY' on /v1/* (401 otherwise). Prefer the environment "
                   "variable: a command line is visible to every user of the machine.")
@click.option("--model-name",
              help="The model id clients send [default: specrt-demo, or the bundle folder's name].")
@click.option("--max-body", type=int, default=1 << 20, show_default=True,
              help="Largest request body in bytes; larger ones get 413.")
@click.option("--drain-timeout", type=float, default=30.0, show_default=True,
              help="On SIGTERM: seconds in-flight requests get to finish before they are cancelled.")
@click.option("--request-timeout", type=float, default=600.0, show_default=True, metavar="SECONDS",
              help="Wall-clock limit of one request, queue included; past it: 504, and the generator moves on.")
@click.option("--max-connections", type=int, default=128, show_default=True,
              help="Open HTTP connections; the next one gets 503 and is closed.")
@click.option("--header-timeout", type=float, default=10.0, show_default=True, metavar="SECONDS",
              help="A connection that has not sent a complete request header this long after it opened (or "
                   "after its last answer) is closed.")
@backend_option
@threads_option
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="info",
              show_default=True)
@low_memory_option
@click.option("--replicas", type=int, metavar="N",
              help="Serve N copies of the bundle on Ray Serve (`pip install 'specrt[cluster]'`), on a local Ray "
                   "instance unless --ray-address: this process is their HTTP entry.")
@click.option("--min-replicas", type=int, metavar="N",
              help="With --max-replicas instead of --replicas: autoscale on queue depth between the two.")
@click.option("--max-replicas", type=int, metavar="N")
@click.option("--ray-address", metavar="ADDR",
              help="Join a running Ray cluster (its head's host:port, or 'auto' on one of its nodes) instead of "
                   "starting one. --bundle must be the same path on every node.")
@click.option("--replica-gpus", type=float, default=0.0, show_default=True, metavar="G",
              help="GPUs each replica holds (1: a device of its own). Each replica holds --threads CPUs (1 when "
                   "unset).")
def serve(bundle: str | None, host: str, port: int, method: str, gamma: int | str, draft_stop: float,
          row_stable: bool, tree_shape: str,
          eagle_tree: str,
          max_queue: int, reuse_prefix: bool,
          api_key: str | None, model_name: str | None, max_body: int, drain_timeout: float,
          request_timeout: float, max_connections: int, header_timeout: float, backend: str,
          threads: int | None, thread_pool: str, log_level: str, low_memory: bool | None, replicas: int | None,
          min_replicas: int | None, max_replicas: int | None, ray_address: str | None, replica_gpus: float) -> None:
    """Serve the bundle with OpenAI's HTTP API (needs `pip install 'specrt[serve]'`).

    \b
    POST /v1/completions, POST /v1/chat/completions  JSON, or server-sent events with "stream": true;
                                                     each answer carries usage and a "specrt" object
                                                     (accepted/drafted, tokens per target pass, alpha)
    GET /v1/models, GET /health
    GET /metrics                                     Prometheus: requests, tokens, tokens/s, alpha,
                                                     queue depth, latency histograms
    Chat needs a bundle with a chat template (the demo has none).

    One generator serves requests in arrival order (batch size 1); temperature, top_p, top_k, seed, max_tokens and
    stop are per request. SIGTERM lets in-flight requests finish (--drain-timeout), then exits 0.

    With --replicas (or --min/--max-replicas, or --ray-address) the same API runs on Ray Serve replicas, one
    generator each: a request whose replica dies before answering goes to another, a stream whose replica dies ends
    with an error event, and Ray restarts the replica.

    \b
    Examples:
      specrt serve                                    # the demo bundle on http://127.0.0.1:8000/v1
      SPECRT_API_KEY=secret specrt serve --bundle bundle --host 0.0.0.0 --port 8080 --gamma auto
      curl -N localhost:8000/v1/completions -H 'Content-Type: application/json' \\
        -d '{"model": "specrt-demo", "prompt": "def fib(n):", "max_tokens": 64, "stream": true}'
      specrt serve --replicas 2 --threads 1           # two replicas on a local Ray instance
      specrt serve --ray-address auto --min-replicas 1 --max-replicas 4 --bundle /srv/bundle --host 0.0.0.0
    """
    try:
        from ..serve import ServeConfig
        from ..serve import run as serve_forever
    except ImportError as e:
        missing = (e.name or "a dependency").split(".")[0]  # the package to install, not its submodule
        raise click.ClickException(f"serve needs the serve extra ({missing} is missing): "
                                   "pip install 'specrt[serve]'") from None
    config = ServeConfig(host=host, port=port, method=method, gamma=gamma, tree=tree_shape, eagle_tree=eagle_tree,
                         draft_stop=draft_stop, row_stable=row_stable, reuse_prefix=reuse_prefix,
                         max_queue=max_queue,
                         api_key=api_key, max_body_bytes=max_body, model_name=model_name,
                         drain_timeout_s=drain_timeout, request_timeout_s=request_timeout,
                         max_connections=max_connections, header_timeout_s=header_timeout, log_level=log_level)
    announce = functools.partial(click.echo, err=True)
    load = {"backend": backend, "threads": threads, "low_memory": low_memory, "shared_threads": thread_pool == "shared"}
    if replicas is None and min_replicas is None and max_replicas is None and ray_address is None:
        gen = load_bundle(bundle, **load)
        if gen.drafter_note:
            announce(f"note: {gen.drafter_note}")
        serve_forever(gen, config, announce=announce)
        return
    from ..serve.app import bundle_model_id
    from ..serve.cluster import ClusterConfig, run_cluster

    if replicas is not None and (min_replicas is not None or max_replicas is not None):
        raise click.UsageError("give --replicas N, or --min-replicas and --max-replicas to autoscale, not both")
    cluster = ClusterConfig(replicas=1 if replicas is None else replicas, min_replicas=min_replicas,
                            max_replicas=max_replicas, address=ray_address, cpus=float(threads or 1), gpus=replica_gpus)
    run_cluster(bundle, load, config, cluster,
                bundle_model_id(bundle, config), announce=announce)
