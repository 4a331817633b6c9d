"""llama.cpp as a peer, through llama-cpp-python, on a GGUF: the one the bundle was exported from, or one
named with ``--peer-gguf``. Two peers: plain decoding, and llama-cpp-python's own speculative mode
(prompt lookup: ``LlamaPromptLookupDecoding``, drafts verified in one llama.cpp batch).

llama.cpp's other speculative modes (draft-simple, draft-eagle3, the ngram caches) live in its
``llama-speculative*`` programs, not in the bindings: ``benchmarks/side-by-side/side_by_side.py`` runs those binaries.
llama_cpp is imported inside the functions, so registering the kind costs nothing.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Sequence

from ...errors import ConfigError, ModelLoadError, SpecrtError
from ...runtime.sampling import SamplingConfig
from . import PeerRequest, PeerRun, register_peer

# -DGGML_NATIVE=OFF: on these VMs a native build died with SIGILL (kernels chosen for flags the VM reports
# but does not run); the portable build picks its kernels from the flags given.
INSTALL = ('CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DLLAVA_BUILD=OFF" '
           "pip install 'specrt[llamacpp]'")
# llama-cpp-python's advice for CPU-only machines (its README): 2 predicted tokens, 10 on GPUs.
LOOKUP_TOKENS = 2
LOOKUP_NGRAM = 2
_CTX_STEP = 512


def _llama_cpp():
    try:
        import llama_cpp
    except ImportError as e:
        raise SpecrtError(f"--compare llamacpp needs llama-cpp-python ({e.name} is missing): {INSTALL}") from None
    except (OSError, RuntimeError) as e:  # the package is there, its shared library is not loadable
        raise SpecrtError(f"llama-cpp-python is installed but its library does not load ({e}); reinstall: "
                          f"{INSTALL}") from None
    return llama_cpp


def peer_gguf(request: PeerRequest) -> Path:
    """``--peer-gguf``, else the bundle's source when it was exported from a GGUF."""
    path = request.gguf or (request.target if request.target.suffix.lower() == ".gguf" else None)
    if path is None:
        raise ConfigError(f"--compare llamacpp needs a GGUF: the bundle was exported from {request.target}; pass "
                          "--peer-gguf FILE (or export the bundle from a GGUF: specrt export model.gguf)")
    if not path.is_file():
        raise ModelLoadError(f"--compare llamacpp: GGUF {path} does not exist")
    return path


def sampling_kwargs(sampling: SamplingConfig) -> dict:
    """``Llama.generate`` settings for specrt's: every filter llama-cpp-python turns on by default (min_p 0.05,
    top_k 40, top_p 0.95) off unless asked for. Its top_k 0 keeps the whole vocabulary, as specrt's."""
    off = {"repeat_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "typical_p": 1.0,
           "min_p": 0.0}
    if sampling.greedy:
        return off | {"temp": 0.0, "top_k": 1, "top_p": 1.0}
    return off | {"temp": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p}


class LlamaCppPeer:
    """Decodes from specrt's prompt ids with ``Llama.generate``, one prompt at a time, from an empty KV cache
    (llama-cpp-python would otherwise reuse a previous call's prefix and skip the prompt's prefill)."""

    def __init__(self, gguf: Path, name: str, threads: int | None = None, lookup: int | None = None) -> None:
        self.lc = _llama_cpp()
        self.gguf, self.name, self.lookup = Path(gguf), name, lookup
        self.threads = threads or os.cpu_count() or 1  # its own default is half the cores
        self._llm = None
        self._ctx = 0
        llm = self._model(_CTX_STEP)
        how = (f"prompt lookup ({lookup} tokens, n-grams ≤ {LOOKUP_NGRAM})" if lookup else "plain decoding")
        self.description = (f"llama.cpp via llama-cpp-python {self.lc.__version__}, {how}, "
                            f"{llm._model.desc()} ({self.gguf.name}), {self.threads} threads")
        self.details = {"gguf": str(self.gguf), "model": llm._model.desc(), "threads": self.threads,
                        "llama_cpp_python": self.lc.__version__, "lookup_tokens": lookup,
                        "sampling_order": "llama.cpp filters top-k, top-p before temperature; specrt after"}

    def _model(self, need: int):
        """The model with a context of at least ``need`` tokens (rebuilt only when a longer one is asked for:
        a lookup peer keeps logits for every position, n_ctx × vocabulary floats)."""
        if self._llm is None or need > self._ctx:
            ctx = -(-need // _CTX_STEP) * _CTX_STEP
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            draft = LlamaPromptLookupDecoding(LOOKUP_NGRAM, self.lookup) if self.lookup else None
            self._llm = None
            try:
                self._llm = self.lc.Llama(str(self.gguf), n_ctx=ctx, n_batch=min(ctx, 512), n_threads=self.threads,
                                          n_threads_batch=self.threads, draft_model=draft, verbose=False)
            except (ValueError, RuntimeError) as e:
                raise ModelLoadError(f"llama.cpp cannot load {self.gguf}: {e}") from None
            self._ctx = ctx
        return self._llm

    def encode(self, prompt: str) -> list[int]:
        return [int(t) for t in self._model(_CTX_STEP).tokenize(prompt.encode(), add_bos=True, special=True)]

    def generate(self, prompt_ids: Sequence[list[int]], max_new_tokens: int, sampling: SamplingConfig,
                 seed: int) -> PeerRun:
        kwargs, outs, seconds = sampling_kwargs(sampling), [], 0.0
        for ids in prompt_ids:
            llm = self._model(len(ids) + max_new_tokens + 1)
            llm.set_seed(seed)
            llm.reset()
            vocab, out = llm._model.vocab, []
            t0 = time.perf_counter()
            if max_new_tokens > 0:
                for tok in llm.generate(list(ids), reset=True, **kwargs):
                    if self.lc.llama_vocab_is_eog(vocab, tok):
                        break
                    out.append(int(tok))
                    if len(out) == max_new_tokens:
                        break
            seconds += time.perf_counter() - t0
            outs.append(out)
        return PeerRun(outs, seconds)


@register_peer("llamacpp")
def _llamacpp(request: PeerRequest) -> list[LlamaCppPeer]:
    gguf = peer_gguf(request)
    return [LlamaCppPeer(gguf, "llamacpp", request.threads),
            LlamaCppPeer(gguf, "llamacpp-lookup", request.threads, lookup=LOOKUP_TOKENS)]
