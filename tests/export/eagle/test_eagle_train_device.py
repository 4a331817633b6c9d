"""Where `specrt eagle train` runs (--device): the names it takes, the precision it picks per device, and the
training step and sampler on the `meta` device, which refuses any tensor left on the CPU beside it as CUDA
would. The CUDA run itself is scripts/gpu_check.py's "EAGLE-3 training on CUDA" section (CPU vs GPU)."""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest
import torch
from click.testing import CliRunner
from support.models import tiny_head_and_batch

from specrt.cli import main
from specrt.errors import ConfigError
from specrt.export.eagle import generate as eg
from specrt.export.eagle import train as et
from specrt.export.eagle import ttt
from specrt.export import precision
from specrt.export.eagle.train import EagleTrainConfig, train_eagle


def test_device_names_are_checked_when_configured_and_resolved_when_run(monkeypatch):
    assert precision.parse_device("auto") is None
    assert precision.parse_device("cuda:1") == torch.device("cuda", 1)
    for bad in ("tpu", "mps", "gpu0", ""):
        with pytest.raises(ConfigError, match="device"):
            EagleTrainConfig(device=bad)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert precision.resolve_device("auto") == torch.device("cpu")
    assert precision.resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ConfigError, match="use --device cpu"):
        precision.resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert precision.resolve_device("auto") == torch.device("cuda")
    assert precision.resolve_device("cuda:0") == torch.device("cuda", 0)
    with pytest.raises(ConfigError, match="sees 1 CUDA GPU"):
        precision.resolve_device("cuda:1")


def test_compute_auto_on_a_gpu_is_bfloat16_where_it_multiplies_it_natively(monkeypatch):
    seen = []

    def supported(including_emulation: bool = True, answer: list = [True]) -> bool:
        seen.append(including_emulation)
        return answer[0]

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", supported)
    assert precision.resolve_compute("auto", "cuda") == "bfloat16"
    supported.__defaults__[1][0] = False
    assert precision.resolve_compute("auto", torch.device("cuda", 0)) == "float32"
    assert seen == [False, False]  # emulated bfloat16 (pre-Ampere) is slower than float32
    assert precision.resolve_compute("float32", "cuda") == "float32"
    with warnings.catch_warnings():  # "CUDA is not available": the context is only built here, not entered
        warnings.simplefilter("ignore")
        assert precision.compute_context("bfloat16", "cuda").device == "cuda"


def test_a_training_step_keeps_every_tensor_on_the_heads_device(monkeypatch):
    """On `meta` any tensor made on the CPU beside the batch (a mask, positions, a row index) raises, as it
    would on CUDA: the unrolled steps, the loss and its backward run where the head is. (A boolean row
    selection has no data-free shape: meta then takes every row.)"""
    import torch.fx.experimental._config as fx_config

    monkeypatch.setattr(fx_config, "meta_nonzero_assume_all_nonzero", True)
    head, embed, t2d, b = tiny_head_and_batch()
    meta = torch.device("meta")
    head = head.to(meta)
    batch = et.SequenceCache(**{k: v.to(meta) for k, v in vars(b).items()})
    _, kls = ttt.step_kls(head, embed.to(meta), t2d.to(meta), batch, 3)
    assert len(kls) == 3 and all(total.device == meta for total, _ in kls)
    sum(total for total, _ in kls).backward()
    assert all(p.grad is not None and p.grad.device == meta for p in head.parameters())
    assert ttt.ttt_mask(6, 2, meta).device == meta
    cpu_batch = b.batch([2, 0], meta)  # a cache in host memory hands its batches over to the device
    assert cpu_batch.taps.device == meta and tuple(cpu_batch.tokens.shape) == (2, 10)


def test_sampling_draws_its_uniforms_on_the_cpu_whatever_the_device():
    """One CPU generator feeds rows on any device: the same seed gives the same stream of draws."""
    probs = torch.rand(4, 700)
    on_meta = eg.sample_rows(probs.to("meta"), torch.Generator().manual_seed(0))
    assert on_meta.device.type == "meta" and tuple(on_meta.shape) == (4,)
    a = eg.sample_rows(probs, torch.Generator().manual_seed(0))
    b = eg.sample_rows(probs, torch.Generator().manual_seed(0))
    assert torch.equal(a, b)


def test_asking_for_a_gpu_without_one_is_one_line_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="cuda"):
        train_eagle(tmp_path / "no-target-needed", tmp_path / "head", EagleTrainConfig(device="cuda"),
                    prompts=["a", "b"])
    assert not (tmp_path / "head").exists()
    result = CliRunner().invoke(main, ["eagle", "train", str(tmp_path), "-o", str(tmp_path / "head"),
                                       "--device", "cuda"])
    assert result.exit_code == 1, result.output
    assert "device 'cuda'" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "head").exists()
    for bad, says in (("tpu", "unknown device"), ("mps", "the CPU or a CUDA GPU")):
        result = CliRunner().invoke(main, ["eagle", "train", str(tmp_path), "-o", str(tmp_path / "head"),
                                           "--device", bad])
        assert result.exit_code == 1 and says in result.output, result.output


def test_a_run_records_its_device_and_cpu_equals_auto_without_a_gpu(tmp_path, monkeypatch):
    from support.models import make_tokenizer, save_model

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    target = save_model(tmp_path / "target", "llama", seed=1, vocab=288, layers=4, hidden=32, heads=2, kv_heads=1,
                        tokenizer=make_tokenizer(vocab=280))
    cfg = EagleTrainConfig(steps=6, lr=3e-3, batch_size=4, seq_len=24, num_sequences=8, draft_vocab=64, topk=16,
                           heldout_fraction=0.25, compute="float32")
    prompts = ["def fib(n):", "for i in range(10):", "class Point:", "import os"]
    auto = train_eagle(target, tmp_path / "auto", cfg, prompts=prompts)
    cpu = train_eagle(target, tmp_path / "cpu", replace(cfg, device="cpu"), prompts=prompts)
    assert auto["device"] == cpu["device"] == "cpu"
    assert auto["config"]["device"] == "auto" and cpu["config"]["device"] == "cpu"
    assert auto["loss"]["history"] == cpu["loss"]["history"]
    weights = [(tmp_path / run / "model.safetensors").read_bytes() for run in ("auto", "cpu")]
    assert weights[0] == weights[1]
