"""``row_stable``: no target pass after the prefill has one row, so a chain reproduces plain decoding bit for
bit on quantized targets (one-row passes take other kernels; multi-row causal passes agree row for row:
benchmarks/verify-cost/row_numerics.py)."""

from __future__ import annotations

import pytest

import specrt
from specrt.runtime.kvcache import CacheLength
from specrt.runtime.loop import verify_rows

PROMPT = "def fib(n):"


class _State:
    def __init__(self, tokens: list[int], cached: int, min_rows: int) -> None:
        cache = CacheLength(32)
        cache.length = cached
        self.tokens, self.min_rows = tokens, min_rows
        self.target = type("T", (), {"cache": cache})()


@pytest.mark.parametrize("min_rows, drafted, want, cached_after", [
    (1, [], [13], 3),          # plain decoding: the one token the cache lacks
    (2, [], [12, 13], 2),      # row-stable: the token before is taken back and fed again
    (2, [7], [13, 7], 3),      # a draft already makes two rows
    (2, [7, 8], [13, 7, 8], 3),
])
def test_verify_rows_takes_back_a_cached_token_only_for_a_one_row_pass(min_rows, drafted, want, cached_after):
    s = _State([10, 11, 12, 13], cached=3, min_rows=min_rows)
    assert verify_rows(s, drafted) == want and s.target.cache.length == cached_after


@pytest.fixture(scope="module")
def int8_bundle(close_bundle, tmp_path_factory):
    from specrt.export.quant.quantize import QuantizeOptions, quantize_bundle

    out = tmp_path_factory.mktemp("row-stable") / "q8"
    quantize_bundle(close_bundle, out, QuantizeOptions(bits=8))
    return out


def test_row_stable_chains_match_row_stable_plain_decoding_on_int8(int8_bundle):
    gen = specrt.load(int8_bundle, threads=1)
    gen.verify_costs()  # ngram's gate reads the verify-cost curve: measured here, not among the passes counted
    rows: list[int] = []
    forward = gen.decoders["target"].forward

    def counting(cache, ids, *args, **kwargs):
        rows.append(len(ids))
        return forward(cache, ids, *args, **kwargs)

    gen.decoders["target"].forward = counting
    want = gen.generate(PROMPT, max_new_tokens=24, method="none", row_stable=True)
    assert min(rows[1:]) == 2 and len(rows) == want.stats.target_passes  # every step two rows, none skipped
    for method in ("draft", "ngram"):
        rows.clear()
        got = gen.generate(PROMPT, max_new_tokens=24, method=method, row_stable=True)
        assert got.token_ids == want.token_ids and min(rows[1:]) >= 2, method


def test_row_stable_changes_kernels_not_the_tokens_at_fp32(close_bundle):
    """At fp32 one row and two agree to ~1e-5: plain decoding gives the same tokens either way."""
    close = specrt.load(close_bundle, threads=1)
    for method in ("none", "draft"):
        assert (close.generate(PROMPT, max_new_tokens=24, method=method, row_stable=True).token_ids
                == close.generate(PROMPT, max_new_tokens=24, method=method).token_ids), method


def test_the_cli_flag_reaches_run_and_bench(int8_bundle, tmp_path):
    import json

    from click.testing import CliRunner

    from specrt.cli import main

    want = specrt.load(int8_bundle, threads=1).generate(PROMPT, max_new_tokens=16, method="none", row_stable=True)
    run = CliRunner().invoke(main, ["run", PROMPT, "--bundle", str(int8_bundle), "--method", "draft", "--row-stable",
                                    "--max-new-tokens", "16", "--threads", "1", "--json"])
    assert run.exit_code == 0, run.output
    assert json.loads(run.output)["token_ids"] == want.token_ids
    out = tmp_path / "bench.json"
    bench = CliRunner().invoke(main, ["bench", "--bundle", str(int8_bundle), "--methods", "none,draft", "--row-stable",
                                      "--max-new-tokens", "8", "--repeats", "1", "--threads", "1", "--json", str(out)])
    assert bench.exit_code == 0, bench.output
    data = json.loads(out.read_text())
    assert data["config"]["row_stable"] is True and data["methods"]["draft"]["greedy_matches_none"] is True
