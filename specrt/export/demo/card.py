"""The demo pair's model card (``MODEL_CARD.md``), rendered from its ``training.json`` record."""

from __future__ import annotations

from ...theory import expected_tokens


def model_card(record: dict) -> str:
    """A short markdown model card rendered from a training.json record."""
    cfg, corp, alpha = record["config"], record["corpus"], record["alpha"]
    t, d = cfg["target"], cfg["draft"]
    a_t1 = alpha["alpha_t1"]
    lines = [
        "# specrt demo target/draft pair",
        "",
        "Two small Llama-architecture causal language models trained from scratch on Python source code, shipped "
        "so that `specrt` can demonstrate speculative decoding without downloading anything. They complete Python "
        "code plausibly but are toys: do not use them for anything else.",
        "",
        "## Data",
        "",
        f"- {corp['source']}, Python {corp['python_version']}, licence {corp['licence']}.",
        f"- {corp['files']} files, {corp['bytes']:,} bytes ({corp['train_files']} train / {corp['val_files']} "
        f"validation files, split by sha1 of the relative path, {corp['val_fraction']:.0%} held out)"
        + (f", capped at {corp['max_bytes']:,} bytes per split" if corp["max_bytes"] else "") + ".",
        f"- sha256 over (path, length, contents) of every file used: `{corp['sha256']}`.",
        f"- Tokenizer: byte-level BPE, {record['tokens']['vocab_size']} tokens, `<s>` = 0 (prepended), `</s>` = 1 "
        f"(ends each file); {record['tokens']['train']:,} training tokens.",
        "",
        "## Models",
        "",
        "| | hidden | layers | heads | kv heads | MLP | parameters |",
        "|---|---|---|---|---|---|---|",
        f"| target | {t['hidden']} | {t['layers']} | {t['heads']} | {t['kv_heads']} | {t['intermediate']} | "
        f"{record['params']['target']:,} |",
        f"| draft | {d['hidden']} | {d['layers']} | {d['heads']} | {d['kv_heads']} | {d['intermediate']} | "
        f"{record['params']['draft']:,} |",
        "",
        f"Tied embeddings, {cfg['max_position_embeddings']} positions, fp32. Trained on CPU with AdamW "
        f"(lr {cfg['lr']:g}, warmup then cosine), batch {cfg['batch_size']} x {cfg['seq_len']} tokens: the target "
        f"for {cfg['target_steps']} steps ({record['time_s']['target'] / 60:.1f} min) by next-token cross entropy, "
        f"then the draft for {cfg['draft_steps']} steps ({record['time_s']['draft'] / 60:.1f} min) by distillation "
        f"from the frozen target ({1 - cfg['ce_weight']:g} x KL(p_target || q_draft) + {cfg['ce_weight']:g} x CE).",
        "",
        "## Results (held-out files)",
        "",
        "| | val loss at init | val loss | train objective |",
        "|---|---|---|---|",
        f"| target | {record['target']['init_val_loss']:.3f} | {record['target']['final_val_loss']:.3f} | "
        f"{record['target']['final_train_loss']:.3f} |",
        f"| draft | {record['draft']['init_val_loss']:.3f} | {record['draft']['final_val_loss']:.3f} | "
        f"{record['draft']['final_train_loss']:.3f} |",
        "",
        "Losses are nats per token; the draft's train objective is its KL/CE mix, its val loss plain CE.",
        "",
        f"- Draft KL(p_target || q_draft): {record['draft']['init_val_kl']:.3f} at init, "
        f"{record['draft']['final_val_kl']:.3f} after distillation (nats per token).",
        f"- Acceptance rate, greedy (argmax agreement): {alpha['alpha_greedy']:.3f}; at temperature 1 "
        f"(mean sum_x min(p, q)): {a_t1:.3f}, over {alpha['positions']:,} positions.",
        f"- At temperature 1 with gamma = 4 drafted tokens, that is about "
        f"{expected_tokens(min(max(a_t1, 0.0), 1.0), 4):.2f} tokens per target pass (Leviathan et al., i.i.d. "
        "acceptance).",
        "",
        "## Reproduce",
        "",
        "```",
        "python -m specrt.export.demo.train --out DIR --config training.json",
        "```",
        "",
        f"Trained with Python {record['versions']['python']}, torch {record['versions']['torch']}, transformers "
        f"{record['versions']['transformers']}, tokenizers {record['versions']['tokenizers']}, "
        f"{cfg['threads']} threads, seed {cfg['seed']}. The same versions and thread count give the same weights.",
        "",
    ]
    return "\n".join(lines)
