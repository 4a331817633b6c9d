"""The peers specrt is compared with: Hugging Face transformers ``generate``, plain and assisted
(``assistant_model=``), on the same weights and prompts. Torch side only; used by ``bench --compare hf``."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from ..errors import ModelLoadError


def _load(folder: Path, dtype: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (folder / "config.json").is_file():
        raise ModelLoadError(f"--compare hf needs the Hugging Face checkpoint; {folder} has no config.json "
                             "(pass --hf-target/--hf-draft)")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).eval()
    return model, AutoTokenizer.from_pretrained(folder)


def hf_generate_bench(target: Path, draft: Path | None, prompts: list[str], max_new_tokens: int, repeats: int,
                      threads: int | None = None, dtype: str = "float32") -> dict:
    """Median tokens/s over repeats of the whole prompt set, greedy, for plain and assisted generate."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    model, tok = _load(Path(target), dtype)
    assistant = _load(Path(draft), dtype)[0] if draft is not None else None
    encoded = [tok(p, return_tensors="pt") for p in prompts]
    modes = {"hf_generate": {}} | ({"hf_assisted": {"assistant_model": assistant}} if assistant is not None else {})

    def run(kwargs: dict) -> float:
        tokens, seconds = 0, 0.0
        for enc in encoded:
            t0 = time.perf_counter()
            with torch.no_grad():
                out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                     pad_token_id=tok.eos_token_id, **kwargs)
            seconds += time.perf_counter() - t0
            tokens += out.shape[1] - enc["input_ids"].shape[1]
        return tokens / seconds

    run(modes["hf_generate"])  # warm-up
    results = {name: [] for name in modes}
    for _ in range(repeats):
        for name, kwargs in modes.items():
            results[name].append(run(kwargs))
    return {name: {"tokens_per_second": statistics.median(v)} for name, v in results.items()}
