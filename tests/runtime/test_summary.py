"""The logits summary graph a GPU backend runs over logits left in device memory: the shipped file is
what the builder makes, its top K and normaliser are right within the stated bound, and rows read
through it warp, verify and sample exactly as the host rows do (run here on ONNX Runtime CPU)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from test_logits import CONFIGS, QWEN2_VOCAB, _related, check_device_chains, logits_row

from specrt.bundle import contract as C
from specrt.export.graph.summary import build_summary_model
from specrt.runtime.acceptance import accept_chain
from specrt.runtime.backends.summary import SummaryLogits, lse_error_bound
from specrt.runtime.rows import LogitRows
from specrt.runtime.sampling import SamplingConfig
from specrt.runtime.warp import warp


@pytest.fixture(scope="module")
def summary_session():
    return ort.InferenceSession(str(C.summary_graph_path()), providers=["CPUExecutionProvider"])


def on_device(session, logits: np.ndarray) -> SummaryLogits:
    """SummaryLogits over host rows, the summary run by ONNX Runtime CPU, every row copy counted."""

    def summarize(start, rows, inv_t):
        return tuple(session.run(None, {C.SUMMARY_LOGITS: logits[start:start + rows],
                                        C.SUMMARY_INV_T: np.array([inv_t], np.float32)}))

    return SummaryLogits(len(logits), logits.shape[1], summarize, lambda i: logits[i].copy())


def test_the_shipped_graph_is_the_builders():
    assert C.summary_graph_path().read_bytes() == build_summary_model().SerializeToString()


@pytest.mark.parametrize("v", [64, 240, 256, 300, 4096, 49_152, QWEN2_VOCAB, 256_000])
def test_top_k_and_normaliser_within_the_bound(summary_session, v):
    """Vocabularies under a block, a multiple of one and between: every intermediate of the graph is
    non-empty (ONNX Runtime 1.30 fails on reductions over an empty slice)."""
    rng = np.random.default_rng(v)
    for kind in ("peaked", "gaussian", "flat", "ties"):
        logits = np.stack([logits_row(kind, v, rng) * rng.uniform(0.5, 8) for _ in range(3)]).astype(np.float32)
        for temperature in (0.05, 0.7, 1.0, 2.5):
            values, ids, lse = summary_session.run(None, {C.SUMMARY_LOGITS: logits,
                                                          C.SUMMARY_INV_T: np.array([1 / temperature], np.float32)})
            assert ids.dtype == np.int32 and ids.shape == values.shape == (3, C.SUMMARY_TOP_K)
            np.testing.assert_array_equal(values, np.take_along_axis(logits, ids.astype(np.int64), 1))
            kth = np.sort(logits, axis=1)[:, -C.SUMMARY_TOP_K]
            assert (values >= kth[:, None]).all()  # the K largest (any order among ties)
            z = logits.astype(np.float64) / temperature
            exact = z.max(1) + np.log(np.exp(z - z.max(1, keepdims=True)).sum(1))
            bound = lse_error_bound(v, lse.astype(np.float64), values.max(1) / temperature)
            assert (np.abs(lse - exact) <= bound).all(), (kind, temperature, np.abs(lse - exact), bound)
            assert (bound < 2e-3).all()


def test_the_bound_grows_with_the_vocabulary_and_the_scale():
    small, large = lse_error_bound(4096, np.zeros(1), np.zeros(1)), lse_error_bound(QWEN2_VOCAB, np.zeros(1), np.zeros(1))
    assert 0 < small[0] < large[0] < 2e-4
    assert lse_error_bound(4096, np.array([300.0]), np.array([300.0]))[0] > small[0] + 1e-4


@pytest.mark.parametrize("kind", ["peaked", "gaussian", "flat", "ties"])
def test_rows_read_through_the_summary_warp_as_the_host_rows(summary_session, kind):
    """Same kept sets and probabilities as the whole rows give; rows cross only when the summary
    cannot decide, and a peaked row's top-k / top-p / greedy never needs one."""
    rng = np.random.default_rng(len(kind))
    v = 30_000
    for cfg in CONFIGS:
        logits = np.stack([logits_row(kind, v, rng) for _ in range(4)])
        device = on_device(summary_session, logits).tail(3)
        rows = LogitRows(None, cfg, v, device=device, count=3)
        for i in range(3):
            np.testing.assert_allclose(rows[i].dense(), warp(logits[1 + i], cfg, v).dense(), rtol=1e-9, atol=1e-15,
                                       err_msg=str(cfg))
        summary = 3 * (8 * C.SUMMARY_TOP_K + 4)
        if kind == "peaked" and (cfg.greedy or cfg.top_k or cfg.top_p < 1):
            assert device.copied_bytes == summary, cfg  # decided by the summary alone
        if cfg.greedy and kind != "ties":
            assert device.copied_bytes == summary


def test_a_k_way_tie_at_the_top_reads_the_row():
    logits = np.zeros((2, 500), np.float32)
    logits[1, 7] = 1.0
    calls = []

    def summarize(start, rows, inv_t):
        ids = np.tile(np.arange(100, 100 + C.SUMMARY_TOP_K, dtype=np.int32), (rows, 1))  # a device's tie order
        ids[1] = np.arange(C.SUMMARY_TOP_K)
        ids[1, 0] = 7
        return np.take_along_axis(logits, ids.astype(np.int64), 1), ids, np.zeros(rows, np.float32)

    device = SummaryLogits(2, 500, summarize, lambda i: calls.append(i) or logits[i].copy())
    assert device.argmax().tolist() == [0, 7]  # row 0: all 500 tie, so the row decides: the lowest id
    assert calls == [0]


def test_a_top_p_edge_inside_the_normaliser_error_reads_the_row():
    """Two ids whose mass sits a hair from top-p: exact in float64 it is decided, but the summary's
    float32 normaliser cannot tell, so the row is read and the host's answer is the reference's."""
    v = 1000
    logits = np.full((1, v), -40.0, np.float32)
    logits[0, :2] = [0.0, np.log(0.9 / 0.1)]  # masses 0.1 and 0.9 (+ a negligible floor)
    cfg = SamplingConfig(temperature=1.0, top_p=0.9)
    reads = []

    def summarize(start, rows, inv_t):
        ids = np.argsort(-logits, axis=1, kind="stable")[:, :C.SUMMARY_TOP_K].astype(np.int32)
        z = logits.astype(np.float64)
        lse = (z.max(1) + np.log(np.exp(z - z.max(1, keepdims=True)).sum(1))).astype(np.float32)
        return np.take_along_axis(logits, ids.astype(np.int64), 1), ids, lse

    device = SummaryLogits(1, v, summarize, lambda i: reads.append(i) or logits[i].copy())
    rows = LogitRows(None, cfg, v, device=device, count=1)
    np.testing.assert_allclose(rows[0].dense(), warp(logits[0], cfg, v).dense(), rtol=1e-12)
    assert reads == [0]


def test_a_chain_verified_through_the_summary_decides_as_from_host_rows(summary_session):
    check_device_chains(lambda logits: on_device(summary_session, logits), np.random.default_rng(8), 150)


def test_a_padded_row_never_uses_the_normaliser_of_the_ids_it_is_cut_to_leave_out(summary_session):
    """A draft whose embedding is padded past the target's vocabulary: its host rows are cut to the
    vocabulary, so a normaliser over the whole padded row is not theirs."""
    rng = np.random.default_rng(3)
    v, width = 4000, 4096
    logits = np.stack([logits_row("peaked", width, rng) for _ in range(2)])
    logits[:, v:] = 11.0  # padded ids with real mass, none among the top ids
    cfg = SamplingConfig(temperature=0.8, top_p=0.9)
    rows = LogitRows(None, cfg, v, device=on_device(summary_session, logits), count=2)
    for i in range(2):
        np.testing.assert_allclose(rows[i].dense(), warp(logits[i][:v], cfg, v).dense(), rtol=1e-9, atol=1e-15)


def test_temperature_alone_reads_one_whole_row_per_chain(summary_session):
    """With no truncation every id keeps mass, yet the acceptance test needs p(x) alone: the summary's
    top logits and normaliser (and the token's one logit when it is not among them) decide it, so only
    the residual's or the bonus's row crosses whole; the tokens are the host rows' for the same uniforms."""
    rng = np.random.default_rng(9)
    v = 20_000
    cfg = SamplingConfig(temperature=1.0)
    for case in range(60):
        logits = np.stack([logits_row(rng.choice(["peaked", "gaussian"]), v, rng) for _ in range(5)])
        q = [_related(r, rng, cfg, v) for r in logits[:4]]
        tokens = [d.sample(rng) for d in q]
        seed = int(rng.integers(1 << 30))
        host = accept_chain(LogitRows(logits, cfg, v), q, tokens, np.random.default_rng(seed))
        reads = []
        device = on_device(summary_session, logits)
        device._fetch_row = lambda i, fetch=device._fetch_row: reads.append(i) or fetch(i)
        dev = accept_chain(LogitRows(None, cfg, v, device=device, count=5), q, tokens, np.random.default_rng(seed))
        assert host == dev, case
        assert reads == [host[0]], (case, reads)  # the rejected row (residual) or the bonus row, nothing else


def test_the_one_sample_beta_is_unbiased():
    """acceptance_beta on a row read only at the drafted token: min(1, p(x)/q(x)) with x ~ q averages
    to sum min(p, q); a biased variant (x from p instead of q) is caught by the same test."""
    from specrt.runtime.dist import overlap
    from specrt.runtime.rows import acceptance_beta

    rng = np.random.default_rng(10)
    v = 3000
    cfg = SamplingConfig(temperature=1.0)
    logits = np.stack([logits_row("gaussian", v, rng) * 0.5])
    rows = LogitRows(None, cfg, v, device=on_device(ort.InferenceSession(str(C.summary_graph_path())), logits), count=1)
    q = _related(logits[0], rng, cfg, v)
    exact = overlap(warp(logits[0], cfg, v), q)
    draws = 20_000
    xs, ys = q.dense(), warp(logits[0], cfg, v).dense()
    est = np.mean([acceptance_beta(rows, 0, q, int(x)) for x in rng.choice(v, draws, p=xs / xs.sum())])
    biased = np.mean([acceptance_beta(rows, 0, q, int(x)) for x in rng.choice(v, draws, p=ys / ys.sum())])
    assert abs(est - exact) < 4 * 0.5 / np.sqrt(draws), (est, exact)
    assert abs(biased - exact) > 4 * 0.5 / np.sqrt(draws), (biased, exact)
