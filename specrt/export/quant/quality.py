"""The quantization gate's measurements: a quantized graph's distribution against its float source, and what
quantizing costs an EAGLE-3 head (both on ONNX Runtime CPU, over the same prompts)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...bundle import contract as C
from ...bundle.manifest import Manifest
from ...bundle.parity import decisive as decisive_rows
from ...bundle.parity import row_kl


def prompt_ids(bundle: Path, manifest: Manifest, prompts: list[str], shortest: int) -> list[np.ndarray]:
    """Each prompt's ids by the bundle's tokenizer, cut to its context; those shorter than ``shortest`` left out."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(bundle / manifest.tokenizer.file))
    encoded = (np.array(tok.encode(p, add_special_tokens=False).ids[: manifest.max_context], np.int64)
               for p in prompts)
    return [ids for ids in encoded if ids.size >= shortest]


def distribution_parity(reference: Path, quantized: Path, manifest: Manifest, role: str,
                        prompts: list[str]) -> dict[str, float]:
    """Mean KL(p_float || p_quantized) and decisive top-1 agreement over every position of the prompts
    (one prefill each), both bundles on ONNX Runtime CPU."""
    from ...runtime.backends.onnxruntime import OrtDecoder
    from ...runtime.masks import causal_mask

    entry = manifest.models[role]
    decoders = [OrtDecoder(folder, entry, threads=None) for folder in (reference, quantized)]
    kls, agree, decisive = [], 0, 0
    for ids in prompt_ids(reference, manifest, prompts, 1):
        rows = [d.forward(d.new_cache(len(ids)), ids, np.arange(len(ids)), causal_mask(len(ids), 0)).logits.copy()
                for d in decoders]
        kls.extend(row_kl(rows[0], rows[1]))
        sure = decisive_rows(rows[0])
        decisive += int(sure.sum())
        agree += int((rows[0].argmax(-1) == rows[1].argmax(-1))[sure].sum())
    return {"mean_kl": float(np.mean(kls)), "top1_agreement": agree / decisive if decisive else 1.0,
            "decisive_positions": decisive, "positions": len(kls)}


def head_acceptance(bundles: list[Path], manifest: Manifest, prompts: list[str]) -> list[float]:
    """Per bundle (each with its own target and head, float or quantized): the EAGLE-3 head's greedy first-draft
    acceptance, teacher-forced over every position of the prompts: how often the head's argmax, read from that
    target's taps, is the target's own next greedy token. What quantizing costs the head, in one figure."""
    from ...runtime.backends.onnxruntime import OrtDecoder
    from ...runtime.masks import causal_mask

    head_entry = manifest.eagle
    encoded = prompt_ids(bundles[0], manifest, prompts, 3)  # a row to score needs two tokens after it
    vocab_map = np.load(bundles[0] / head_entry.vocab_map, allow_pickle=False)
    out = []
    for folder in bundles:
        target = OrtDecoder(folder, manifest.target, threads=None)
        head = OrtDecoder(folder, head_entry, threads=None, role="draft")
        hits = total = 0
        for ids in encoded:
            n = len(ids)
            run = target.forward(target.new_cache(n), ids, np.arange(n), causal_mask(n, 0))
            best, taps = run.logits.argmax(-1), run.extra[C.EAGLE_TAPS][: n - 1].copy()
            # head row j: taps of position j with token j+1, predicting token j+2 (the target's argmax at j+1)
            rows = head.forward(head.new_cache(n), ids[1:], np.arange(n - 1), causal_mask(n - 1, 0), extra={
                C.EAGLE_TAPS: taps, C.EAGLE_FEATURES: np.zeros((n - 1, head_entry.dims.hidden_size), np.float32)})
            drafted = vocab_map[rows.logits.argmax(-1)]
            hits += int((drafted[:-1] == best[1:n - 1]).sum())
            total += n - 2
        out.append(hits / total if total else 0.0)
    return out
