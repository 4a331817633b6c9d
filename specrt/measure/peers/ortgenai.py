"""ONNX Runtime GenAI as a peer: its own model builder on the bundle's source checkpoint, at the bundle's
precision, cached; plain decoding with ``og.Generator``.

onnxruntime_genai is imported inside the functions; the builder runs in a child process (it needs torch,
transformers and onnx_ir) with downloads switched off.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ...bundle.manifest import ModelEntry, id_set
from ...errors import INSTALL_TORCH, ConfigError, ModelLoadError, SpecrtError
from ...runtime.sampling import SamplingConfig
from . import PeerRequest, PeerRun, missing_checkpoint, register_peer, until_end

# What the builder (0.18) makes for the CPU execution provider: FP32, INT8 and INT4 (fp16/bf16 are for
# CUDA, DML, TensorRT-RTX). Both quantized kinds are MatMulNBits weight-only, as specrt's quantize.
PRECISIONS = ("fp32", "int8", "int4")
INSTALL = "pip install 'specrt[peers]'"


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "specrt" / "peers"


def _og():
    try:
        import onnxruntime_genai
    except ImportError as e:
        raise SpecrtError(f"--compare ortgenai needs onnxruntime-genai ({e.name} is missing): {INSTALL}") from None
    return onnxruntime_genai


@dataclass(frozen=True)
class BuildSpec:
    """What the builder is asked for; ``note`` says why it is not the bundle's own precision."""

    precision: str
    block_size: int | None = None  # MatMulNBits weights per scale (int4/int8)
    accuracy_level: int | None = None  # MatMulNBits activations: 4 = int8 (the builder's CPU default)
    note: str | None = None

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ConfigError(f"ONNX Runtime GenAI peer precision must be one of {', '.join(PRECISIONS)} "
                              f"(its builder's CPU precisions), got {self.precision!r}")

    def extra_options(self) -> list[str]:
        if self.precision == "fp32":
            return []
        return ([f"block_size={self.block_size}"] if self.block_size else []) + (
            [f"accuracy_level={self.accuracy_level}"] if self.accuracy_level else [])


def bundle_precision(entry: ModelEntry) -> str:
    q = entry.quantization
    return f"int{q['bits']}" if q else {"float32": "fp32", "float16": "fp16"}[entry.dtype]


def matching_spec(entry: ModelEntry, override: str | None = None) -> BuildSpec:
    """The builder precision matching the bundle's target (int4 → int4 with its block size, int8 → int8,
    fp16 → fp32: the builder has no fp16 for CPU, fp32 → fp32), or ``override`` (--peer-precision)."""
    ours = bundle_precision(entry)
    q = entry.quantization or {}
    precision = override or ("fp32" if ours == "fp16" else ours)
    quantized = {"block_size": q.get("block_size"), "accuracy_level": q.get("accuracy_level")} \
        if precision == ours and q else {}
    note = None
    if precision != ours:
        note = (f"--peer-precision {precision}; the bundle is {ours}" if override else
                "the bundle is fp16; ONNX Runtime GenAI's builder has no fp16 for CPU, so fp32")
    return BuildSpec(precision, note=note, **quantized)


def cache_key(checkpoint: Path, spec: BuildSpec, og_version: str) -> str:
    """Checkpoint files (name, size, mtime) + precision and options + onnxruntime-genai's version. Sizes and
    mtimes stand in for a content hash: reading GBs of weights on every bench would cost more than a build."""
    files = sorted((p.relative_to(checkpoint).as_posix(), p.stat().st_size, p.stat().st_mtime_ns)
                   for p in checkpoint.rglob("*") if p.is_file())
    blob = json.dumps({"files": files, "precision": spec.precision, "extra": spec.extra_options(),
                       "onnxruntime_genai": og_version}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Built:
    path: Path
    cached: bool  # found in the cache: nothing was built this time
    build_seconds: float  # what the build took, when it was made


INFO = "specrt-peer.json"


def build_model(checkpoint: Path, spec: BuildSpec, cache_dir: Path,
                on_progress: Callable[[str], None] | None = None) -> Built:
    """The builder's model of ``checkpoint`` for CPU, from ``cache_dir`` or built into it. A build runs in a
    temporary folder renamed into place only when complete: a failed or interrupted one leaves nothing."""
    og = _og()
    checkpoint = Path(checkpoint).resolve()
    if not (checkpoint / "config.json").is_file():
        raise ModelLoadError(missing_checkpoint(checkpoint, "--hf-target"))
    final = Path(cache_dir) / f"{checkpoint.name}-{spec.precision}-{cache_key(checkpoint, spec, og.__version__)}"
    if (final / "genai_config.json").is_file():
        info = json.loads((final / INFO).read_text())
        return Built(final, True, info["build_seconds"])
    missing = [m for m in ("torch", "transformers", "onnx_ir") if importlib.util.find_spec(m) is None]
    if missing:
        raise SpecrtError(f"ONNX Runtime GenAI's model builder needs torch, transformers and onnx_ir ({missing[0]} is "
                          f"missing): {INSTALL_TORCH} && pip install 'specrt[export,peers]'")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(checkpoint), "-o", str(tmp / "model"),
           "-p", spec.precision, "-e", "cpu", "-c", str(tmp / "builder-cache")]
    if spec.extra_options():
        cmd += ["--extra_options", *spec.extra_options()]
    t0 = time.perf_counter()
    tail: deque[str] = deque(maxlen=40)
    proc = None
    try:
        # Text mode turns the progress bars' \r into line ends: each bar update arrives as a line.
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "HF_HUB_OFFLINE": "1"})
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip():
                tail.append(line.strip())
                if on_progress:
                    on_progress(line.strip()[:100])
        rc = proc.wait()
        if rc != 0 or not (tmp / "model" / "genai_config.json").is_file():
            raise ModelLoadError(f"ONNX Runtime GenAI's model builder failed on {checkpoint} at {spec.precision} "
                                 f"(exit {rc}): {tail[-1] if tail else 'no output'}")
        seconds = time.perf_counter() - t0
        (tmp / "model" / INFO).write_text(json.dumps({
            "checkpoint": str(checkpoint), "precision": spec.precision, "extra_options": spec.extra_options(),
            "onnxruntime_genai": og.__version__, "build_seconds": seconds, "command": cmd}, indent=2))
        try:
            (tmp / "model").rename(final)
        except OSError:  # another process finished the same build first: use its copy
            if not (final / "genai_config.json").is_file():
                raise
        return Built(final, False, seconds)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def search_options(sampling: SamplingConfig, seed: int, max_length: int) -> dict:
    """``GeneratorParams.set_search_options`` for specrt's settings. Every setting explicit: the builder
    copies the checkpoint's generation defaults into genai_config.json, and GenAI's own top_k default is
    50. In 0.18 top_k 0 is off (top-p alone, over the whole vocabulary when top_p is 1)."""
    opts = {"max_length": max_length, "min_length": 0, "num_beams": 1, "repetition_penalty": 1.0}
    if sampling.greedy:
        return opts | {"do_sample": False}
    return opts | {"do_sample": True, "temperature": sampling.temperature, "top_k": sampling.top_k,
                   "top_p": sampling.top_p, "random_seed": seed}


class OrtGenaiPeer:
    """Plain decoding with ``og.Generator`` from specrt's prompt ids, one prompt at a time."""

    def __init__(self, model_dir: Path, name: str = "ortgenai", description: str = "", threads: int | None = None,
                 details: dict | None = None) -> None:
        og = self.og = _og()
        config = og.Config(str(model_dir))
        # As many intra-op threads as specrt's own sessions get: GenAI's default ran like one thread on a 2-core
        # VM (the demo's int4 target: 490-630 against 865-935 tokens/s with two), which made in-process
        # comparisons flatter specrt ~1.5x against GenAI in its own process.
        self.threads = threads or os.cpu_count() or 1
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": self.threads}}}}))
        self.model = og.Model(config)
        self.tokenizer = og.Tokenizer(self.model)
        self.end_ids = id_set(json.loads((Path(model_dir) / "genai_config.json").read_text())["model"]["eos_token_id"])
        self.name = name
        self.description = description or f"ONNX Runtime GenAI {og.__version__} plain decoding"
        self.details = {**(details or {}), "threads": self.threads}

    def encode(self, prompt: str) -> list[int]:
        return [int(t) for t in self.tokenizer.encode(prompt)]

    def generate(self, prompt_ids: Sequence[list[int]], max_new_tokens: int, sampling: SamplingConfig,
                 seed: int) -> PeerRun:
        og, outs, seconds = self.og, [], 0.0
        for ids in prompt_ids:
            t0 = time.perf_counter()
            params = og.GeneratorParams(self.model)
            params.set_search_options(**search_options(sampling, seed, len(ids) + max_new_tokens))
            g = og.Generator(self.model, params)
            g.append_tokens(list(ids))
            while not g.is_done():
                g.generate_next_token()
            seconds += time.perf_counter() - t0
            outs.append(until_end(g.get_sequence(0)[len(ids):], self.end_ids))
        return PeerRun(outs, seconds)


def hf_folder(checkpoint: Path, cache_dir: Path, on_progress: Callable[[str], None] | None = None) -> Path:
    """``checkpoint`` as the Hugging Face folder the builder reads: a GGUF (the source of a bundle exported from
    one) is dequantized by transformers into ``cache_dir`` once, in a child process (torch stays out of the
    bench's), and reused while the file is unchanged. The builder then quantizes those weights its own way."""
    checkpoint = Path(checkpoint)
    if checkpoint.suffix.lower() != ".gguf" or not checkpoint.is_file():
        return checkpoint
    where = hashlib.sha256(str(checkpoint.resolve()).encode()).hexdigest()[:12]
    folder = Path(cache_dir) / f"{checkpoint.stem}-{where}-hf"
    if on_progress:
        on_progress(f"reading {checkpoint.name} into a Hugging Face folder")
    proc = subprocess.run([sys.executable, "-m", "specrt.export.quant.gguf", str(checkpoint), str(folder)],
                          capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        raise ModelLoadError(f"ONNX Runtime GenAI's builder needs a Hugging Face folder; reading {checkpoint} into "
                             f"one failed: {lines[-1] if lines else f'exit {proc.returncode}'}")
    return folder


def ortgenai_peer(checkpoint: Path, entry: ModelEntry, cache_dir: Path, precision: str | None = None,
                  threads: int | None = None, on_progress: Callable[[str], None] | None = None) -> OrtGenaiPeer:
    """The peer for a bundle's target ``entry``: built (or found in ``cache_dir``) from ``checkpoint`` (a
    Hugging Face folder, or a GGUF: :func:`hf_folder`)."""
    og = _og()
    spec = matching_spec(entry, precision)
    checkpoint = hf_folder(checkpoint, cache_dir, on_progress)
    built = build_model(checkpoint, spec, cache_dir, on_progress)
    details = {"precision": spec.precision, "bundle_precision": bundle_precision(entry), "note": spec.note,
               "extra_options": spec.extra_options(), "model_dir": str(built.path), "cached": built.cached,
               "build_seconds": built.build_seconds, "onnxruntime_genai": og.__version__}
    return OrtGenaiPeer(built.path, "ortgenai", f"ONNX Runtime GenAI {og.__version__} plain decoding, {spec.precision} "
                        "(its model builder), cpu", threads, details)


@register_peer("ortgenai", precision=True)
def _ortgenai(request: PeerRequest) -> list[OrtGenaiPeer]:
    return [ortgenai_peer(request.target, request.entry, request.cache_dir or default_cache_dir(), request.precision,
                          request.threads, request.on_progress)]
