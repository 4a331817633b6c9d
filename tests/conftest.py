from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from support.models import (  # noqa: E402
    CHAT_TEMPLATE,
    FACTORIES,
    make_tokenizer,
    save_model,
    save_pair,
)


@pytest.fixture(autouse=True)
def _own_cache_dir(tmp_path_factory, monkeypatch):
    """specrt's per-user cache (the trusted-engine registry) in a folder of the test session, not ~/.cache."""
    monkeypatch.setenv("SPECRT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "specrt-cache"))
    # The CLI's default pool (shared) is ONNX Runtime's global one: process-wide and for good, so CLI commands
    # run inside this process would put every later session of the test run on it. They get a pool per model;
    # tests/runtime/test_thread_pool.py runs the shared pool in processes of its own.
    monkeypatch.setenv("SPECRT_THREAD_POOL", "per-model")


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """The torch backend and the peers set torch's thread count for the process (as a runtime should); put it
    back after each test, or an in-process export later in the run computes its PyTorch reference on other
    threads (float sums in another order) than the same export in a child process."""
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    yield
    torch = sys.modules.get("torch")
    if torch is not None and before is not None and torch.get_num_threads() != before:
        torch.set_num_threads(before)


@pytest.fixture(scope="session")
def pairs(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """A saved tiny (target, draft) HF pair per supported architecture."""
    root = tmp_path_factory.mktemp("hf")
    return {arch: save_pair(root, arch) for arch in FACTORIES}


@pytest.fixture(scope="session")
def bundles(pairs, tmp_path_factory) -> dict[str, Path]:
    """Each pair exported once with the default (dynamo) exporter: the shipped path."""
    from specrt.export.exporter import export_bundle

    root = tmp_path_factory.mktemp("bundles")
    return {arch: export_bundle(str(t), str(d), root / arch) and root / arch for arch, (t, d) in pairs.items()}


@pytest.fixture(scope="session")
def llama_bundle(bundles) -> Path:
    return bundles["llama"]


@pytest.fixture(scope="session")
def eagle_bundle(tmp_path_factory) -> Path:
    """A tiny llama target exported with a random EAGLE-3 head."""
    from support.models import save_eagle_head

    from specrt.export.exporter import export_bundle

    root = tmp_path_factory.mktemp("eagle-e2e")
    target = save_model(root / "target", "llama", seed=1, layers=5, hidden=64, tokenizer=make_tokenizer())
    # Most of the vocabulary, shuffled: q maps through a non-trivial vocab map and still lands on p's
    # top ids often enough that acceptances happen too
    head = save_eagle_head(root / "head", target, seed=3, draft_vocab=240, ascending=False)
    export_bundle(str(target), None, root / "bundle", eagle=str(head))
    return root / "bundle"


@pytest.fixture(scope="session")
def dflash_bundle(tmp_path_factory) -> Path:
    """A tiny llama target exported with a random DFlash draft over part of its vocabulary that reads an inner
    layer and the last one (whose tap is the final normed state), blocks of 4."""
    from support.dflash import save_dflash_draft

    from specrt.export.exporter import ExportOptions, export_bundle

    root = tmp_path_factory.mktemp("dflash-e2e")
    target = save_model(root / "target", "llama", seed=1, layers=5, hidden=64, tokenizer=make_tokenizer())
    draft = save_dflash_draft(root / "draft", target, seed=3, draft_vocab=240, ids=(1, 4), block=4)
    export_bundle(str(target), None, root / "bundle", ExportOptions(dflash=str(draft)))
    return root / "bundle"


@pytest.fixture(scope="session")
def generator(llama_bundle):
    import specrt

    return specrt.load(llama_bundle, threads=1)


@pytest.fixture(scope="session")
def close_pair(pairs, tmp_path_factory) -> tuple[Path, Path]:
    """A draft that mostly agrees with its target (the target with a perturbed MLP): chains are
    accepted, partly accepted and rejected, so every branch of the loop runs."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = tmp_path_factory.mktemp("close")
    target = pairs["llama"][0]
    draft = AutoModelForCausalLM.from_pretrained(target)
    torch.manual_seed(0)
    with torch.no_grad():
        for layer in draft.model.layers:
            layer.mlp.down_proj.weight.add_(0.5 * torch.randn_like(layer.mlp.down_proj.weight)
                                            * layer.mlp.down_proj.weight.std())
    draft.save_pretrained(root / "draft")
    AutoTokenizer.from_pretrained(target).save_pretrained(root / "draft")
    return target, root / "draft"


@pytest.fixture(scope="session")
def close_bundle(close_pair, tmp_path_factory) -> Path:
    """The close pair exported as a user would by default (fused graphs for llama)."""
    from specrt.export.exporter import export_bundle

    out = tmp_path_factory.mktemp("close-bundle") / "bundle"
    export_bundle(str(close_pair[0]), str(close_pair[1]), out)
    return out


def _close_with_graph(close_pair, tmp_path_factory, graph: str) -> Path:
    from specrt.export.exporter import ExportOptions, export_bundle

    out = tmp_path_factory.mktemp(f"close-{graph}") / "bundle"
    export_bundle(str(close_pair[0]), str(close_pair[1]), out, ExportOptions(graph=graph))
    return out


@pytest.fixture(scope="session")
def portable_close_bundle(close_pair, tmp_path_factory) -> Path:
    """The close pair with plain-op graphs (what TensorRT builds from)."""
    return _close_with_graph(close_pair, tmp_path_factory, "portable")


@pytest.fixture(scope="session")
def gqa_close_bundle(close_pair, tmp_path_factory) -> Path:
    """The close pair with GroupQueryAttention graphs (`--graph gqa`)."""
    return _close_with_graph(close_pair, tmp_path_factory, "gqa")


@pytest.fixture(scope="session")
def gqa_static_close_bundle(close_pair, tmp_path_factory) -> Path:
    """The close pair with static-shape GroupQueryAttention graphs (`--graph gqa-static`)."""
    return _close_with_graph(close_pair, tmp_path_factory, "gqa-static")


@pytest.fixture(scope="session")
def eagle_static_bundle(tmp_path_factory) -> Path:
    """A tiny llama target and a random EAGLE-3 head, both as static-shape GroupQueryAttention graphs."""
    from support.models import save_eagle_head

    from specrt.export.exporter import ExportOptions, export_bundle

    root = tmp_path_factory.mktemp("eagle-static")
    target = save_model(root / "target", "llama", seed=1, layers=5, hidden=64, tokenizer=make_tokenizer())
    head = save_eagle_head(root / "head", target, seed=3, draft_vocab=240, ascending=False)
    export_bundle(str(target), None, root / "bundle", ExportOptions(graph="gqa-static"), eagle=str(head))
    return root / "bundle"


@pytest.fixture(scope="session")
def self_bundle(pairs, tmp_path_factory) -> Path:
    """Draft == target: greedy chains are always fully accepted (exercises the draft's catch-up)."""
    from specrt.export.exporter import export_bundle

    target = pairs["llama"][0]
    out = tmp_path_factory.mktemp("self") / "bundle"
    export_bundle(str(target), str(target), out)
    return out


@pytest.fixture(scope="session")
def medusa_bundle(pairs, tmp_path_factory) -> Path:
    """The tiny llama pair plus Medusa heads trained for a few steps on the tests' own sources."""
    from specrt.export.exporter import ExportOptions, export_bundle
    from specrt.export.medusa import MedusaTrainConfig, train_medusa

    root = tmp_path_factory.mktemp("medusa")
    target, draft = pairs["llama"]
    train_medusa(str(target), Path(__file__).parent, root / "heads",
                 MedusaTrainConfig(num_heads=3, steps=25, seq_len=64, batch_size=4, topk=6))
    export_bundle(str(target), str(draft), root / "bundle",
                  ExportOptions(exporter="torchscript", medusa=str(root / "heads"), medusa_nodes=12))
    return root / "bundle"


@pytest.fixture(scope="session")
def chat_source(tmp_path_factory) -> Path:
    """A tiny llama folder: tokenizer with <|im_start|>/<|im_end|> and a chat template, and a generation
    config listing two end ids (as Llama 3's lists <|eot_id|> and <|end_of_text|>)."""
    tok = make_tokenizer()
    tok.add_special_tokens({"extra_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = CHAT_TEMPLATE
    folder = save_model(tmp_path_factory.mktemp("chat") / "instruct", "llama", seed=1, tokenizer=tok)
    end_of_turn = tok.convert_tokens_to_ids("<|im_end|>")
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": [1, end_of_turn]}))
    return folder


@pytest.fixture(scope="session")
def chat_bundle(chat_source, tmp_path_factory) -> Path:
    """chat_source exported alone (no draft): chat tests and the server's chat endpoint use it."""
    from specrt.export.exporter import ExportOptions, export_bundle

    out = tmp_path_factory.mktemp("chat-bundle") / "bundle"
    export_bundle(str(chat_source), None, out, ExportOptions(exporter="torchscript"))
    return out
