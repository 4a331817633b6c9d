"""Tiny llama.cpp GGUF files written from a Hugging Face llama folder, as llama.cpp's convert_hf_to_gguf.py
lays them out (tensor names, q/k rotary row permutation, BPE tokenizer metadata), with the block types a
test asks for."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: HF's rotate-half row order → llama.cpp's interleaved."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_llama_gguf(folder: Path, out: Path, *, linear: str = "Q4_1", embedding: str = "Q8_0",
                     chat_template: str | None = None) -> Path:
    """``folder`` (a saved HF llama with a fast tokenizer) as a GGUF at ``out``: the linear weights as
    ``linear``, the token embedding as ``embedding`` (GGML type names; F32 stays float), norms F32."""
    import gguf
    from safetensors.numpy import load_file
    from transformers import AutoConfig, AutoTokenizer

    cfg = AutoConfig.from_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    state = load_file(str(folder / "model.safetensors"))
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name("tiny")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"] if getattr(cfg, "rope_parameters", None)
                               else cfg.rope_theta))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_vocab_size(cfg.vocab_size)

    vocab = tok.get_vocab()
    tokens = [""] * cfg.vocab_size
    for text, i in vocab.items():
        if i < cfg.vocab_size:
            tokens[i] = text
    special = {tok.bos_token_id, tok.eos_token_id}
    for i in range(cfg.vocab_size):  # ids past the tokenizer's own (the model's padding): unused tokens
        tokens[i] = tokens[i] or f"[PAD{i}]"
    types = [gguf.TokenType.CONTROL if i in special else
             gguf.TokenType.USER_DEFINED if tokens[i].startswith("[PAD") else gguf.TokenType.NORMAL
             for i in range(cfg.vocab_size)]
    merges = json.loads(tok.backend_tokenizer.to_str())["model"]["merges"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_bos_token_id(tok.bos_token_id)
    w.add_eos_token_id(tok.eos_token_id)
    w.add_add_bos_token(True)
    if chat_template:
        w.add_chat_template(chat_template)

    def add(name: str, value: np.ndarray, kind: str) -> None:
        value = np.ascontiguousarray(value, dtype=np.float32)
        qtype = gguf.GGMLQuantizationType[kind]
        if qtype == gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, value)
        else:
            w.add_tensor(name, gguf.quants.quantize(value, qtype), raw_dtype=qtype)

    add("token_embd.weight", state["model.embed_tokens.weight"], embedding)
    add("output_norm.weight", state["model.norm.weight"], "F32")
    if "lm_head.weight" in state and not cfg.tie_word_embeddings:
        add("output.weight", state["lm_head.weight"], linear)
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down"}
    for i in range(cfg.num_hidden_layers):
        hf = f"model.layers.{i}."
        add(f"blk.{i}.attn_norm.weight", state[hf + "input_layernorm.weight"], "F32")
        add(f"blk.{i}.ffn_norm.weight", state[hf + "post_attention_layernorm.weight"], "F32")
        for src, dst in names.items():
            value = state[hf + src + ".weight"]
            if dst == "attn_q":
                value = _permute(value, cfg.num_attention_heads)
            elif dst == "attn_k":
                value = _permute(value, cfg.num_key_value_heads)
            add(f"blk.{i}.{dst}.weight", value, linear)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
