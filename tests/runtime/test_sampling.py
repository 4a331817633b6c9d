import numpy as np
import pytest

from specrt.errors import ConfigError
from specrt.runtime.sampling import SamplingConfig, probs_from_logits, sample


def test_greedy_is_one_hot_argmax():
    logits = np.array([[0.1, 2.0, -1.0], [5.0, 1.0, 4.9]], np.float32)
    p = probs_from_logits(logits, SamplingConfig())
    assert p.dtype == np.float64
    assert np.array_equal(p, np.eye(3)[[1, 0]])


def test_temperature_softmax_in_float64():
    logits = np.array([[1.0, 2.0, 3.0]], np.float32)
    p = probs_from_logits(logits, SamplingConfig(temperature=0.5))
    e = np.exp(np.array([2.0, 4.0, 6.0]) - 6.0)
    assert np.allclose(p[0], e / e.sum(), atol=1e-15)


def test_top_k_keeps_exactly_k():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, 50))
    p = probs_from_logits(logits, SamplingConfig(temperature=1.0, top_k=5))
    assert ((p > 0).sum(axis=1) == 5).all()
    for row, lg in zip(p, logits):
        assert set(np.flatnonzero(row)) == set(np.argsort(-lg)[:5])
    assert np.allclose(p.sum(1), 1)


def test_top_p_keeps_smallest_set_reaching_p():
    logits = np.log(np.array([[0.5, 0.25, 0.15, 0.1]]))
    p = probs_from_logits(logits, SamplingConfig(temperature=1.0, top_p=0.7))
    assert np.allclose(p[0], [0.5 / 0.75, 0.25 / 0.75, 0, 0])
    p = probs_from_logits(logits, SamplingConfig(temperature=1.0, top_p=0.75))
    assert np.count_nonzero(p[0]) == 2  # 0.5 + 0.25 reaches 0.75 exactly
    p = probs_from_logits(logits, SamplingConfig(temperature=1.0, top_p=0.01))
    assert np.allclose(p[0], [1, 0, 0, 0])  # the most likely token is always kept


def test_sample_matches_distribution_and_handles_unnormalised():
    rng = np.random.default_rng(3)
    p = np.array([0.1, 0.0, 0.6, 0.3])
    draws = np.bincount([sample(p * 7.0, rng) for _ in range(20_000)], minlength=4) / 20_000
    assert draws[1] == 0
    assert np.abs(draws - p).max() < 0.02
    with pytest.raises(ValueError):
        sample(np.zeros(3), rng)


@pytest.mark.parametrize("kwargs", [dict(temperature=-0.1), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5),
                                    dict(temperature=float("nan")), dict(temperature=float("inf")),
                                    dict(temperature="1")])
def test_bad_sampling_values(kwargs):
    with pytest.raises(ConfigError):
        SamplingConfig(**kwargs)


@pytest.mark.parametrize("temperature", [1e-31, 1e-38, 1e-40, 5e-324])
@pytest.mark.parametrize("vocab", [500, 50_000])
def test_a_temperature_whose_inverse_overflows_float32_is_greedy(temperature, vocab):
    """Below GREEDY_BELOW (1e-30) a temperature is stored as 0: warp's float32 1/T and logits / T overflowed
    from ~1e-38 (warnings, then a distribution with no mass)."""
    import warnings

    from specrt.runtime.sampling import GREEDY_BELOW
    from specrt.runtime.warp import warp

    assert temperature < GREEDY_BELOW
    logits = (np.random.default_rng(vocab).standard_normal(vocab) * 3).astype(np.float32)
    top = int(np.argmax(logits))
    for kwargs in ({}, {"top_p": 0.9}, {"top_k": 5}):
        cfg = SamplingConfig(temperature, **kwargs)
        assert cfg.greedy and cfg.temperature == 0.0 and cfg == SamplingConfig(0.0, **kwargs)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no overflow on the way
            p = probs_from_logits(logits[None], cfg)[0]
            dist = warp(logits, cfg, vocab)
        assert p[top] == 1.0 and p.sum() == 1.0
        assert dist.prob(top) == 1.0 and dist.support_size == 1
