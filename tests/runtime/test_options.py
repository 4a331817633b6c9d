"""DecodeOptions (one frozen value instead of keyword bags), Stream's result, and the default method: the best
the bundle holds, the same in run, chat, serve and the API."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import specrt
from specrt import DecodeOptions
from specrt.errors import ConfigError
from specrt.runtime.drafters import (
    BUILTIN_METHODS,
    METHODS,
    Drafter,
    DrafterContext,
    NoDrafter,
    drafter_class,
    register_method,
)
from specrt.runtime.tree import TreeShape


def test_options_normalise_their_spellings_and_compare_equal():
    a = DecodeOptions(tree="2,2,1,1", stop="\n\n")
    b = DecodeOptions(tree=(2, 2, 1, 1), stop=["\n\n"])
    assert a == b and a.tree == TreeShape((2, 2, 1, 1)) and a.stop == ("\n\n",)
    assert DecodeOptions.of(a, method="none") == a.replace(method="none") != a


@pytest.mark.parametrize("changes,match", [
    (dict(gamma=0), "gamma"), (dict(gamma=True), "gamma"), (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(temperature=-1), "temperature"), (dict(top_p=1.5), "top_p"), (dict(tree="2,x"), "tree shape"),
    (dict(acceptance="typical", method="draft"), "medusa only"), (dict(acceptance="loose"), "acceptance"),
    (dict(stop=[3]), "stop"),
    # The server's rule for every entry point: a finite temperature in [0, 2], a seed in [0, 2^63 - 1].
    (dict(temperature=float("inf")), r"temperature must be a number in \[0, 2\] \(0: greedy\), got inf"),
    (dict(temperature=2.5), "got 2.5"), (dict(temperature=float("nan")), "got nan"),
    (dict(temperature="0.5"), "got '0.5'"), (dict(temperature=True), "temperature"),
    (dict(seed=-1), r"seed must be an integer in \[0, 2\^63 - 1\], got -1"), (dict(seed=2**63), "seed"),
    (dict(seed=1.5), "seed"), (dict(seed=True), "seed")])
def test_bad_options_are_config_errors(changes, match):
    with pytest.raises(ConfigError, match=match):
        DecodeOptions(**changes)


def test_a_temperature_too_small_for_float32_is_greedy(generator):
    """1/T overflows float32 below ~3e-39 (a traceback once); below 1e-30 the softmax is the argmax's anyway."""
    assert DecodeOptions(temperature=1e-40) == DecodeOptions() and DecodeOptions(temperature=1e-40).sampling.greedy
    assert DecodeOptions(temperature=2.0, seed=2**63 - 1).temperature == 2.0
    assert DecodeOptions(temperature=1e-29).temperature == 1e-29  # still sampled, at a finite 1/T
    greedy = generator.generate("def f(x):", max_new_tokens=8, method="none").token_ids
    for tiny in (1e-40, 5e-324):
        for extra in ({}, {"top_p": 0.9}, {"top_k": 5}):
            out = generator.generate("def f(x):", max_new_tokens=8, method="draft", temperature=tiny, seed=1, **extra)
            assert out.token_ids == greedy, (tiny, extra)


def test_threads_are_bounded_where_the_bundle_loads(llama_bundle):
    """-2 was accepted and 100000 hung (ONNX Runtime starts every thread it is given)."""
    from specrt.runtime.backends.base import MAX_THREADS, check_threads

    assert check_threads(None) is None and check_threads(0) == 0 and check_threads(MAX_THREADS) == MAX_THREADS
    for bad in (-2, MAX_THREADS + 1, 100_000, 1.5, True):
        with pytest.raises(ConfigError, match=r"threads must be an integer in \[1, \d+\] \(0 or none"):
            check_threads(bad)
    with pytest.raises(ConfigError, match="got -2"):
        specrt.load(llama_bundle, threads=-2)


def test_a_misspelt_option_is_an_error_not_silently_ignored(generator):
    with pytest.raises(ConfigError, match="unknown decoding option temprature; known: max_new_tokens"):
        generator.generate("x", temprature=0.7)
    with pytest.raises(ConfigError, match="must be a DecodeOptions"):
        generator.generate("x", {"method": "none"})


def test_options_and_keywords_are_the_same_call(generator):
    opts = DecodeOptions(method="ngram", max_new_tokens=10, temperature=0.8, seed=3)
    assert generator.generate("def f(x):", opts).token_ids == generator.generate(
        "def f(x):", method="ngram", max_new_tokens=10, temperature=0.8, seed=3).token_ids
    # keywords override the options' fields
    assert generator.generate("def f(x):", opts, method="none").stats.method == "none"


def test_stream_returns_its_result(generator):
    stream = generator.stream("def f(x):", max_new_tokens=12, method="none")
    text = "".join(stream)
    assert stream.result.text == text and len(stream.result.token_ids) == 12
    # Reading the result first decodes everything
    early = generator.stream("def f(x):", max_new_tokens=12, method="none")
    assert early.result.token_ids == stream.result.token_ids
    assert not hasattr(generator, "last_result")


def test_bad_options_raise_at_the_call_not_at_the_first_piece(generator):
    with pytest.raises(ConfigError, match="unknown method"):
        generator.stream("x", method="beam")  # nothing iterated yet


def test_every_method_is_built_from_the_context_alone():
    """Drafters take explicit arguments: each declares how it is built from what the bundle offers."""
    ctx = DrafterContext(vocab=10)
    assert type(METHODS["none"].build(ctx)).__name__ == "NoDrafter"
    assert METHODS["ngram"].build(ctx).vocab == 10
    with pytest.raises(TypeError):
        METHODS["ngram"](vocab=10, tree=TreeShape())  # no **_ bag swallowing a keyword


def test_methods_register_from_one_list_and_declare_what_they_need():
    """The built-ins go through register_method from BUILTIN_METHODS, as a plug-in would; --method offers the
    registry's names after auto; what a method needs is read off its class, whose defaults need nothing."""
    from specrt.cli.options import METHODS as CHOICES

    assert list(METHODS)[:len(BUILTIN_METHODS)] == [name for name, _ in BUILTIN_METHODS]
    assert CHOICES == ("auto", *METHODS)
    assert CHOICES[:9] == ("auto", "eagle", "eagle-tree", "dflash", "draft", "tree", "medusa", "ngram", "none")
    assert [n for n, c in METHODS.items() if c.needs_eagle] == ["eagle", "eagle-tree"]
    assert [n for n, c in METHODS.items() if c.needs_dflash] == ["dflash"]
    assert [n for n, c in METHODS.items() if c.drafts_in_one_pass] == ["dflash"]
    assert [n for n, c in METHODS.items() if c.needs_draft_model] == ["draft", "tree"]
    assert [n for n, c in METHODS.items() if c.needs_medusa] == ["medusa"]
    assert [n for n, c in METHODS.items() if c.proposes_trees] == ["eagle-tree", "tree", "medusa"]
    assert [n for n, c in METHODS.items() if c.sizes_tree_by_cost] == ["eagle-tree"]
    assert drafter_class("auto") is Drafter and not drafter_class("auto").proposes_trees

    @register_method("echo")
    class Echo(NoDrafter):
        """A plug-in: needs nothing but what it overrides."""

    try:
        assert METHODS["echo"] is Echo and not Echo.needs_eagle and not Echo.sizes_tree_by_cost
        with pytest.raises(TypeError, match="not a Drafter subclass"):
            register_method("bare")(object)
        assert "bare" not in METHODS
    finally:
        del METHODS["echo"]


def test_auto_picks_the_draft_where_the_bundle_has_one(generator):
    assert generator.default_method == "draft"
    assert generator.generate("def f(x):", max_new_tokens=8).stats.method == "draft"


@pytest.fixture(scope="module")
def solo(chat_bundle):
    return specrt.load(chat_bundle, threads=1)


def test_a_target_only_bundle_runs_and_chats_with_the_default(solo):
    assert solo.default_method == "ngram"
    out = solo.chat([{"role": "user", "content": "hi"}], max_new_tokens=6)
    assert out.stats.method == "ngram"
    assert out.token_ids == solo.chat([{"role": "user", "content": "hi"}], max_new_tokens=6, method="none").token_ids
    assert solo.generate("def f(x):", max_new_tokens=6).stats.method == "ngram"


@pytest.mark.parametrize("args", [["--chat", "hi"], ["def f(x):"]])
def test_cli_run_on_a_target_only_bundle(chat_bundle, args):
    from specrt.cli import main

    res = CliRunner().invoke(main, ["run", *args, "--bundle", str(chat_bundle), "--max-new-tokens", "6", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["stats"]["method"] == "ngram"


def test_serve_defaults_to_the_best_the_bundle_holds(solo):
    from specrt.serve import ServeConfig

    assert ServeConfig().options.method == "auto"
    assert solo.resolve_method(ServeConfig().method) == "ngram"
    with pytest.raises(ConfigError, match="tree shape"):
        ServeConfig(tree="a,b")
