"""GGUF in: a llama.cpp model file becomes a Hugging Face folder (transformers' GGUF loading: config,
tokenizer, chat template, weights dequantized to fp32), and its Q4_0 / Q4_1 / Q8_0 blocks become the
exported graph's ``MatMulNBits`` weights as they are, with no re-quantization.

How a GGUF row reaches the graph: the exported float graph's weight columns are the dequantized GGUF rows,
in some order (transformers un-permutes llama.cpp's rotary row order of q/k, may split fused tensors). Each
output column is matched to its GGUF row by content, so no per-architecture name table is needed and a
match is a proof: the column IS that row, bit for bit. The row's blocks then go in unchanged:

- Q8_0 (d fp16, 32 int8): 8-bit ``MatMulNBits`` with the default zero point 128, data = q + 128. Exact.
- Q4_0 (d fp16, 32 nibbles, value d·(q − 8)): 4-bit with the default zero point 8. Exact.
- Q4_1 (d, m fp16, value d·q + m): ``MatMulNBits`` holds d·(q − 8) exactly; the minimum goes in as a
  per-block float term (:mod:`specrt.export.quant.block_term`), (block sums of A) · (m + 8d)ᵀ. Exact in the
  weights (m + 8d is exact in fp32, checked); only the float accumulation order differs.

Other types (F32, F16, BF16, K-quants) arrive dequantized and stay float in the graph.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import ConfigError, ModelLoadError
from ..graph.edit import drop_dead
from .block_term import BLOCK, BlockTerms
from .lookups import quantize_lookups, tied_heads, untie_lm_head

KEPT = {"Q4_0": 4, "Q4_1": 4, "Q8_0": 8}  # GGML type → MatMulNBits bits
_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}  # bytes per block of 32


def find_gguf(source: str | Path | None) -> Path | None:
    """The GGUF file ``source`` names: a ``.gguf`` file, or a folder with no config.json holding exactly one."""
    if source is None:
        return None
    p = Path(source).expanduser()
    if p.is_file() and p.suffix.lower() == ".gguf":
        return p
    if p.is_dir() and not (p / "config.json").is_file():
        files = sorted(p.glob("*.gguf"))
        if len(files) > 1:
            raise ModelLoadError(f"{p} holds {len(files)} GGUF files ({', '.join(f.name for f in files[:3])}); "
                                 "pass the one to export")
        return files[0] if files else None
    return None


def _reader(path: Path):
    """gguf's reader over ``path``; a file it cannot parse (truncated, not GGUF) is a one-line ModelLoadError."""
    import struct

    import gguf

    try:
        return gguf.GGUFReader(str(path))
    except (OSError, ValueError, KeyError, IndexError, struct.error) as e:
        raise ModelLoadError(f"could not read {path} as GGUF: {e}") from None


def stage(path: Path, folder: Path) -> Path:
    """Write the GGUF at ``path`` as a Hugging Face folder (fp32 safetensors, tokenizer, chat template,
    generation config with its end ids) at ``folder``, through transformers' GGUF loading."""
    import torch
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoTokenizer,
        GenerationConfig,
    )

    _reader(path)  # a corrupt file fails here in one line, not deep inside transformers
    where, name = str(path.parent), path.name
    try:
        config = AutoConfig.from_pretrained(where, gguf_file=name)
        tok = AutoTokenizer.from_pretrained(where, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
        raise ModelLoadError(f"could not read {path} as a GGUF model: {str(e).splitlines()[0]}") from None
    # A fresh model from the config, the loaded weights copied in: what save_pretrained writes then carries
    # no GGUF loading state.
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    found = model.load_state_dict(loaded.state_dict(), strict=False)
    del loaded
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    missing = [k for k in found.missing_keys if k not in tied and not k.endswith("rotary_emb.inv_freq")]
    if missing or found.unexpected_keys:
        raise ModelLoadError(f"{path}: transformers' GGUF loading left {', '.join((missing or found.unexpected_keys)[:3])} "
                             "unread; its architecture mapping does not cover this file")
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    _drop_added_past(folder, config.vocab_size)
    ends = [i for i in (config.eos_token_id, tok.eos_token_id) if i is not None]
    GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=sorted(set(ends)) or None).save_pretrained(folder)
    return folder


def stage_reused(gguf: Path, folder: Path, *, reuse: bool) -> Path:
    """:func:`stage` into ``folder``, or, with ``reuse``, the folder as a previous call left it when it came
    from the same file (path, size, modification time); a fresh one is written beside and renamed in."""
    st = gguf.stat()
    stamp = {"gguf": str(gguf.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    stamp_file = folder / "specrt-gguf.json"
    if reuse and stamp_file.is_file() and json.loads(stamp_file.read_text()) == stamp:
        return folder
    side = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(side, ignore_errors=True)
    stage(gguf, side)
    (side / stamp_file.name).write_text(json.dumps(stamp))
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(side, folder)
    return folder


def has_blocks(path: Path) -> bool:
    """Whether the GGUF holds any weight of a kept type (else it exports float, or as --quantize says)."""
    return any(t.tensor_type.name in KEPT and len(t.shape) == 2 for t in _reader(path).tensors)


def _drop_added_past(folder: Path, vocab_size: int) -> None:
    """transformers' GGUF tokenizer for a byte-level BPE file adds GPT-2's default ``<|endoftext|>`` as its
    unknown token when the vocabulary has none: an id past the model's logits. The saved tokenizer drops
    added tokens past ``vocab_size`` (and the unknown token, when it was one of them)."""
    tok_file, cfg_file = folder / "tokenizer.json", folder / "tokenizer_config.json"
    data = json.loads(tok_file.read_text())
    past = {t["content"] for t in data.get("added_tokens", []) if t["id"] >= vocab_size}
    if not past:
        return
    data["added_tokens"] = [t for t in data["added_tokens"] if t["id"] < vocab_size]
    if data.get("model", {}).get("unk_token") in past:
        data["model"]["unk_token"] = None
    tok_file.write_text(json.dumps(data, ensure_ascii=False))
    if cfg_file.is_file():
        cfg = json.loads(cfg_file.read_text())
        cfg["added_tokens_decoder"] = {k: v for k, v in cfg.get("added_tokens_decoder", {}).items()
                                       if int(k) < vocab_size}
        for key in [k for k, v in cfg.items() if isinstance(v, str) and v in past]:
            del cfg[key]
        cfg_file.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


@dataclass
class _Rows:
    """One GGUF tensor kept as blocks: per row its raw blocks [N, K/32, bytes] and dequantized values."""

    kind: str  # Q4_0 | Q4_1 | Q8_0
    raw: np.ndarray
    values: np.ndarray  # fp32 [N, K]


def _read(path: Path) -> list[_Rows]:
    import gguf

    out = []
    for t in _reader(path).tensors:
        kind = t.tensor_type.name
        if kind not in KEPT or len(t.shape) != 2:
            continue
        raw = np.asarray(t.data, dtype=np.uint8)
        k = int(t.shape[0])  # ggml order: ne0 (the row length) first
        if k % BLOCK or raw.shape[-1] != k // BLOCK * _BYTES[kind]:
            raise ModelLoadError(f"{path}: tensor {t.name} ({kind}) has {raw.shape[-1]} bytes per row for "
                                 f"{k} values")
        values = gguf.quants.dequantize(raw, t.tensor_type).astype(np.float32).reshape(-1, k)
        out.append(_Rows(kind, raw.reshape(len(values), k // BLOCK, _BYTES[kind]), values))
    return out


def _digest(row: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(row).tobytes(), digest_size=16).digest()


class _RowIndex:
    """Every kept GGUF row by the digest of its dequantized values in the graph's float type (an fp16 graph
    holds them rounded to fp16). Equal rows are interchangeable: same values, same products."""

    def __init__(self, tensors: list[_Rows], dtype: np.dtype) -> None:
        self.tensors, self.dtype = tensors, dtype
        self.where: dict[tuple[int, bytes], list[tuple[int, int]]] = {}
        for ti, t in enumerate(tensors):
            for r, row in enumerate(t.values.astype(dtype)):
                self.where.setdefault((row.size, _digest(row)), []).append((ti, r))

    def match(self, columns: np.ndarray) -> list[tuple[int, int]] | None:
        """Per column of ``columns`` [N, K] (a weight's output features), its (tensor, row), all of one block
        type, from one tensor wherever a column's values occur in several (zero rows, say); None when any
        column is not a kept GGUF row, bit for bit in the graph's type."""
        found = []
        for col in columns:
            hits = [h for h in self.where.get((col.size, _digest(col)), [])
                    if np.array_equal(self.tensors[h[0]].values[h[1]].astype(self.dtype), col)]
            if not hits:
                return None
            found.append(hits)
        votes: dict[int, int] = {}
        for hits in found:
            for t in {t for t, _ in hits}:
                votes[t] = votes.get(t, 0) + 1
        best = max(votes, key=lambda t: (votes[t], -t))
        kind = self.tensors[best].kind
        chosen = []
        for hits in found:
            same = [h for h in hits if h[0] == best] or [h for h in hits if self.tensors[h[0]].kind == kind]
            if not same:
                return None  # rows of several block types in one weight: it stays float
            chosen.append(same[0])
        return chosen


def _nibbles(raw: np.ndarray) -> np.ndarray:
    """ggml's 4-bit block payload (byte j: value j low, value j + 16 high) → MatMulNBits' (byte j: values
    2j low, 2j + 1 high), per block."""
    q = np.concatenate([raw & 0x0F, raw >> 4], axis=-1)  # values 0..31 in order
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)


def _half(raw: np.ndarray, at: int) -> np.ndarray:
    return np.ascontiguousarray(raw[..., at:at + 2]).view(np.float16)[..., 0].astype(np.float32)


def _blocks(rows: list[np.ndarray], kind: str) -> tuple[int, np.ndarray, np.ndarray, np.ndarray | None]:
    """(bits, MatMulNBits data [N, K/32, blob], scales [N, K/32] fp32, the Q4_1 term's (m + 8d) [N, K/32] or
    None) from the rows' raw blocks [N, K/32, bytes]."""
    raw = np.stack(rows)
    if kind == "Q8_0":
        q = raw[..., 2:].view(np.int8).astype(np.int16) + 128
        return 8, q.astype(np.uint8), _half(raw, 0), None
    if kind == "Q4_0":
        return 4, _nibbles(raw[..., 2:]), _half(raw, 0), None
    d, m = _half(raw, 0), _half(raw, 2)
    offset = m + 8 * d
    if not np.array_equal(offset.astype(np.float64), m.astype(np.float64) + 8 * d.astype(np.float64)):
        raise ConfigError("a Q4_1 minimum is not exact as m + 8d in fp32; this GGUF cannot be kept as it is")
    return 4, _nibbles(raw[..., 4:]), d, offset


def keep_blocks(path: Path, out: Path, gguf_path: Path, accuracy_level: int) -> dict:
    """Rewrite the float graph ``path`` into ``out`` with every weight whose columns are kept GGUF rows as
    ``MatMulNBits`` holding those rows' blocks (the token lookup tied to a Q8_0 head reads the head's bytes);
    what was done, as a quantization record."""
    from onnx import helper, numpy_helper

    from ...bundle import contract as C
    from ..staging import load_graph, save_graph

    model = load_graph(path)
    if any(n.op_type == "MatMulNBits" for n in model.graph.node):
        raise ConfigError(f"{path.name} is already quantized")
    g = model.graph
    untied = untie_lm_head(model)
    tied = tied_heads(model)
    tensors = _read(gguf_path)
    indexes: dict[np.dtype, _RowIndex] = {}
    if not tensors:
        raise ConfigError(f"{gguf_path.name} has no Q4_0, Q4_1 or Q8_0 weights to keep; export it with --quantize "
                          "int4/int8")
    inits = {i.name: i for i in g.initializer}
    terms = BlockTerms(g, BLOCK)
    written: set[str] = set()  # weights already converted (two MatMuls may read one initializer)
    nodes, kept, floats, types = [], {}, [], {}
    for node in g.node:
        w = inits.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        if w is None or len(w.dims) != 2 or w.dims[0] % BLOCK:
            nodes.append(node)
            continue
        weight = numpy_helper.to_array(w)
        if weight.dtype not in indexes:
            indexes[weight.dtype] = _RowIndex(tensors, weight.dtype)
        index = indexes[weight.dtype]
        hits = index.match(np.ascontiguousarray(weight.T))
        if hits is None:
            floats.append(node.name)
            nodes.append(node)
            continue
        kind = index.tensors[hits[0][0]].kind
        bits, data, scales, offset = _blocks([index.tensors[t].raw[r] for t, r in hits], kind)
        k, n = weight.shape
        dtype = weight.dtype
        base = w.name
        data_name, scale_name = f"{base}_Q{bits}", f"{base}_scales"
        if base not in written:
            g.initializer.extend([numpy_helper.from_array(data, data_name),
                                  numpy_helper.from_array(scales.astype(dtype).reshape(-1), scale_name)])
            written.add(base)
        out_name = node.output[0] if offset is None else f"{node.output[0]}.blocks"
        nodes.append(helper.make_node("MatMulNBits", [node.input[0], data_name, scale_name], [out_name],
                                      name=f"{node.name}_Q{bits}", domain="com.microsoft", K=k, N=n, bits=bits,
                                      block_size=BLOCK, accuracy_level=accuracy_level))
        if offset is not None:
            terms.add(nodes, node.input[0], offset, k, dtype, base, out_name, node.output[0])
        kept[node.name] = kind
        types[kind] = types.get(kind, 0) + 1
    if not kept:
        raise ConfigError(f"no weight of {path.name} matches a Q4_0/Q4_1/Q8_0 tensor of {gguf_path.name}: "
                          "was the graph exported from this GGUF?")
    del g.node[:]
    g.node.extend(nodes)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    # The Q8_0 tied head's lookup reads the head's own blocks; no other table is re-quantized.
    names = {i.name for i in g.initializer}
    shared = {t: w for t, w in tied.items() if f"{w}_Q8" in names}
    tables = quantize_lookups(model, BLOCK, shared, only=set(shared)) if shared else []
    drop_dead(model)  # the float weights the blocks replaced
    save_graph(model, out)
    bits = min(KEPT[k] for k in types)
    float_graph = all(d == np.float32 for d in indexes)
    return {"bits": bits, "block_size": BLOCK, "accuracy_level": accuracy_level, "symmetric": "Q4_1" not in types,
            "format": "gguf", "quantized_matmuls": sorted(kept), "lm_head_untied": untied is not None,
            "gguf": {"file": gguf_path.name, "kept": kept, "float_matmuls": sorted(floats), "types": types,
                     "weights": "bit for bit" + (" (Q4_1: its minimum as a float term beside MatMulNBits, "
                                                  + ("exact in fp32)" if float_graph else "rounded to fp16)")
                                                  if "Q4_1" in types else "")},
            **({"quantized_lookups": tables, "lookup_bits": 8, "lookup_shares_lm_head": tables} if tables else {}),
            "bytes_before": C.graph_bytes(path), "bytes_after": C.graph_bytes(out)}


def _main(argv: list[str]) -> int:
    """``python -m specrt.export.quant.gguf GGUF FOLDER``: :func:`stage_reused` in a child process, for a caller that
    keeps torch out of its own (bench's ONNX Runtime GenAI peer builds from a Hugging Face folder)."""
    import sys

    if len(argv) != 2:
        print("usage: python -m specrt.export.quant.gguf MODEL.gguf FOLDER", file=sys.stderr)
        return 2
    try:
        stage_reused(Path(argv[0]), Path(argv[1]), reuse=True)
    except ModelLoadError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(_main(sys.argv[1:]))
