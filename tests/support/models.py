"""Tiny random Hugging Face models built from configs (no downloads), one per supported architecture."""

from __future__ import annotations

from pathlib import Path

import torch

CORPUS = [
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for i in range(10):\n    print(i, i * i)\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "The quick brown fox jumps over the lazy dog. Speculative decoding is lossless.\n",
    "import os\nimport sys\n\nif __name__ == '__main__':\n    sys.exit(main())\n",
]
# A ChatML-style template (tests/conftest.py's chat_bundle exports a tiny llama with it).
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TOKENIZER_VOCAB = 320  # 256 byte tokens + 2 specials + merges
VOCAB = 336  # model logits: room for tokens that AutoTokenizer classes add (Qwen2 adds <|endoftext|>)


def make_tokenizer(vocab: int = TOKENIZER_VOCAB, extra_text: str = ""):
    """A byte-level BPE trained on a few lines of code, wrapped as a HF fast tokenizer with BOS/EOS."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS * 20 + ([extra_text] * 20 if extra_text else []), trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


def _llama(vocab: int, layers: int, hidden: int, heads: int, kv_heads: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                                        num_hidden_layers=layers, num_attention_heads=heads,
                                        num_key_value_heads=kv_heads, max_position_embeddings=256,
                                        bos_token_id=0, eos_token_id=1))


def _mistral(vocab: int, layers: int, hidden: int, heads: int, kv_heads: int):
    from transformers import MistralConfig, MistralForCausalLM

    return MistralForCausalLM(MistralConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                                            num_hidden_layers=layers, num_attention_heads=heads,
                                            num_key_value_heads=kv_heads, max_position_embeddings=512,
                                            # narrower than the parity check's sequences: the window is exercised
                                            sliding_window=6, bos_token_id=0, eos_token_id=1))


def _qwen2(vocab: int, layers: int, hidden: int, heads: int, kv_heads: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return Qwen2ForCausalLM(Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                                        num_hidden_layers=layers, num_attention_heads=heads,
                                        num_key_value_heads=kv_heads, max_position_embeddings=256,
                                        tie_word_embeddings=True, bos_token_id=0, eos_token_id=1))


def _qwen3(vocab: int, layers: int, hidden: int, heads: int, kv_heads: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    # Sliding attention from layer 1 on (max_window_layers), with a window the tests' sequences exceed.
    return Qwen3ForCausalLM(Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                                        num_hidden_layers=layers, num_attention_heads=heads,
                                        num_key_value_heads=kv_heads, head_dim=32, max_position_embeddings=256,
                                        use_sliding_window=True, sliding_window=6, max_window_layers=1,
                                        tie_word_embeddings=True, bos_token_id=0, eos_token_id=1))


def _gemma2(vocab: int, layers: int, hidden: int, heads: int, kv_heads: int):
    from transformers import Gemma2Config, Gemma2ForCausalLM

    return Gemma2ForCausalLM(Gemma2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                                          num_hidden_layers=layers, num_attention_heads=heads,
                                          num_key_value_heads=kv_heads, head_dim=16, query_pre_attn_scalar=16,
                                          max_position_embeddings=256, sliding_window=5, final_logit_softcapping=5.0,
                                          attn_logit_softcapping=3.0, bos_token_id=0, eos_token_id=1, pad_token_id=1))


def _gemma3_text(vocab: int, layers: int, hidden: int, heads: int, kv_heads: int):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    # Local layers every other one, each with its own rotary base (rope_local_base_freq).
    return Gemma3ForCausalLM(Gemma3TextConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                                              num_hidden_layers=layers, num_attention_heads=heads,
                                              num_key_value_heads=kv_heads, head_dim=16, query_pre_attn_scalar=16,
                                              max_position_embeddings=256, sliding_window=5, sliding_window_pattern=2,
                                              bos_token_id=0, eos_token_id=1, pad_token_id=1))


def _phi3(vocab: int, layers: int, hidden: int, heads: int, kv_heads: int):
    from transformers import Phi3Config, Phi3ForCausalLM

    # longrope: exact up to its original context (64 here), which becomes the bundle's limit.
    half = hidden // heads // 2
    rope = {"type": "longrope", "short_factor": [1.0 + 0.1 * i for i in range(half)],
            "long_factor": [2.0 + 0.3 * i for i in range(half)]}
    return Phi3ForCausalLM(Phi3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                                      num_hidden_layers=layers, num_attention_heads=heads,
                                      num_key_value_heads=kv_heads, max_position_embeddings=256,
                                      original_max_position_embeddings=64, rope_scaling=rope, sliding_window=6,
                                      bos_token_id=0, eos_token_id=1, pad_token_id=1))


def _gpt2(vocab: int, layers: int, hidden: int, heads: int, kv_heads: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=heads,
                                      n_positions=256, bos_token_id=0, eos_token_id=1))


# model_type → factory. tests/test_registry.py fails if a registered architecture is missing here.
FACTORIES = {"llama": _llama, "mistral": _mistral, "qwen2": _qwen2, "qwen3": _qwen3, "gemma2": _gemma2,
             "gemma3_text": _gemma3_text, "phi3": _phi3, "gpt2": _gpt2}


def save_model(folder: Path, model_type: str, *, seed: int, vocab: int = VOCAB, layers: int = 2, hidden: int = 64,
               heads: int = 4, kv_heads: int = 2, tokenizer=None) -> Path:
    """Build, seed and save a tiny model + tokenizer into ``folder`` (created)."""
    torch.manual_seed(seed)
    model = FACTORIES[model_type](vocab, layers, hidden, heads, kv_heads).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    (tokenizer or make_tokenizer()).save_pretrained(folder)
    return folder


def save_pair(root: Path, model_type: str) -> tuple[Path, Path]:
    """A target and a smaller draft of one architecture sharing a tokenizer; the draft's vocab is padded."""
    tok = make_tokenizer()
    target = save_model(root / f"{model_type}-target", model_type, seed=1, layers=2, hidden=64, tokenizer=tok)
    draft = save_model(root / f"{model_type}-draft", model_type, seed=2, layers=1, hidden=32, heads=2, kv_heads=1,
                       vocab=VOCAB + 16, tokenizer=tok)
    return target, draft


def assert_loads_no_torch(bundle: Path, call: str) -> None:
    """Load ``bundle`` and run ``call`` (on ``g``, the generator) in a fresh interpreter: the runtime path
    must import neither torch, transformers nor onnx."""
    import subprocess
    import sys

    code = (f"import sys, specrt; g = specrt.load(sys.argv[1]); {call}; "
            "bad = [m for m in ('torch', 'transformers', 'onnx') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code, str(bundle)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def save_eagle_head(folder: Path, target: Path, *, seed: int = 0, draft_vocab: int = 96, hidden: int | None = None,
                    heads: int = 4, kv_heads: int = 2, ascending: bool = True, embedding: bool = False,
                    taps: tuple[int, int, int] | None = None, config_overrides: dict | None = None) -> Path:
    """A tiny random EAGLE-3 head for the saved HF model ``target``, in the published layout (save_eagle3).

    The draft vocabulary is ``draft_vocab`` random target ids; ``ascending=False`` lists them in a shuffled
    order (d2t then gives non-ascending target ids, which the export must reorder). Norm weights are
    non-trivial so a swapped norm shows. ``hidden``: the head's width [default: the target's; another width
    needs ``embedding=True``, a head that ships its own embed_tokens]."""
    from transformers import AutoConfig

    from specrt.export.eagle.config import Eagle3Config

    from specrt.export.eagle.head import Eagle3Head
    from specrt.export.eagle.checkpoint import save_eagle3

    t = AutoConfig.from_pretrained(target)  # GPT-2's n_embd reads as hidden_size too
    width = hidden or t.hidden_size
    d = {"hidden_size": width, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
         "intermediate_size": 2 * width, "vocab_size": t.vocab_size, "draft_vocab_size": draft_vocab,
         "target_hidden_size": t.hidden_size, "rms_norm_eps": 1e-5, "max_position_embeddings": 256,
         "rope_theta": 10000.0, "taps": taps, **(config_overrides or {})}
    cfg = Eagle3Config(**d)
    g = torch.Generator().manual_seed(seed)
    used = torch.randperm(cfg.vocab_size, generator=g)[:cfg.draft_vocab_size].sort().values
    if not ascending:
        used = used[torch.randperm(len(used), generator=g)]
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[used] = True
    torch.manual_seed(seed)
    head = Eagle3Head(cfg, with_embedding=embedding)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif name == "fc.weight":  # three taps summed: keep the fused features near unit scale
                p.mul_(0.5)
    return save_eagle3(folder, cfg, head.eval(), used - torch.arange(cfg.draft_vocab_size), t2d)


def tiny_head_and_batch():
    """A 20-id draft head over a 50-id target and 3 cached sequences of 10 rows (scored from start to stop)."""
    from specrt.export.eagle.config import Eagle3Config
    from specrt.export.eagle.head import Eagle3Head
    from specrt.export.eagle.data import SequenceCache

    cfg = Eagle3Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                       vocab_size=50, draft_vocab_size=20, target_hidden_size=24)
    torch.manual_seed(0)
    head = Eagle3Head(cfg)
    n, t, k = 3, 10, 5
    g = torch.Generator().manual_seed(1)
    logp = torch.log_softmax(torch.randn(n, t, 20, generator=g), -1).topk(k, -1)
    b = SequenceCache(tokens=torch.randint(0, 50, (n, t), generator=g, dtype=torch.int32),
                      length=torch.tensor([10, 7, 9], dtype=torch.int32), start=torch.tensor([2, 1, 4], dtype=torch.int32),
                      stop=torch.tensor([10, 6, 9], dtype=torch.int32), taps=torch.randn(n, t, 72, generator=g).half(),
                      logp=logp.values.half(), ids=logp.indices.int(),
                      top1=torch.randint(0, 50, (n, t), generator=g, dtype=torch.int32))
    embed, t2d = torch.randn(50, 32, generator=g), torch.rand(50, generator=g) < 0.7
    return head, embed, t2d, b


def save_pattern_target(folder: Path) -> Path:
    """A target that repeats a pattern: its layers add nothing (o_proj, down_proj zero), and its LM head
    sends token x to the next id of x's 3-cycle (2→3→4→2, 5→6→7→5, ...), so every greedy or sampled
    continuation repeats three tokens; ids 0 and 1 (BOS, EOS) lead into the first cycle, never to EOS."""
    from transformers import AutoModelForCausalLM

    folder = save_model(folder, "llama", seed=3, vocab=288, layers=4, hidden=64, heads=4, kv_heads=2,
                        tokenizer=make_tokenizer(vocab=280))
    model = AutoModelForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        e = model.model.embed_tokens.weight
        unit = e / e.pow(2).mean(-1, keepdim=True).sqrt()  # what the final RMS norm makes of E[x]
        nxt = torch.arange(len(e))
        ids = torch.arange(2, len(e))
        for k in range(0, len(ids) - 2, 3):
            nxt[ids[k:k + 3]] = ids[k:k + 3].roll(-1)
        nxt[0] = nxt[1] = 2
        w = torch.zeros_like(model.lm_head.weight)
        w[nxt] = 0.25 * unit  # logit gap ~16 nats: the cycle's next id is the argmax, even sampled
        model.lm_head.weight.copy_(w)
    model.save_pretrained(folder)
    return folder
