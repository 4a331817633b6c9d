"""Chat templates: rendering equals transformers' apply_chat_template on real templates; export keeps the
template, the special tokens and every end id; gen.chat / stream_chat / `specrt run --chat` use them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jinja2
import pytest
from click.testing import CliRunner
from support.models import CHAT_TEMPLATE, assert_loads_no_torch, make_tokenizer

import specrt
from specrt.bundle.manifest import load_manifest
from specrt.cli import main
from specrt.errors import BundleError, ChatTemplateError, ConfigError
from specrt.runtime.chat import ChatTemplate

TEMPLATES = Path(__file__).parents[1] / "data" / "chat_templates"
# The special tokens each family's tokenizer defines (Qwen2.5 has no BOS).
SPECIALS = {
    "llama-3-instruct": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "llama-3.2-instruct": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "qwen2.5-instruct": {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "gemma-2-it": {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"},
    "gemma-3-it": {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"},
    "phi-3.5-mini-instruct": {"bos_token": "<s>", "eos_token": "<|endoftext|>", "unk_token": "<unk>"},
    "mistral-nemo-instruct-2407": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
}
CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hello there"}],
    "system+user": [{"role": "system", "content": "You are terse."},
                    {"role": "user", "content": "  Whitespace, unicode é ✓ and <html> & \"quotes\"\n"}],
    "multi-turn": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
                   {"role": "user", "content": "And 3+3?"}],
    "system+multi-turn": [{"role": "system", "content": "Answer in French."},
                          {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Salut"},
                          {"role": "user", "content": "Bye"}],
    "two users in a row": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
}


def _hf_tokenizer(template: str, specials: dict):
    tok = make_tokenizer()
    for name, value in specials.items():
        setattr(tok, name, value)
    tok.chat_template = template
    return tok


@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("name", sorted(SPECIALS))
def test_rendering_equals_transformers(name, conversation):
    template = (TEMPLATES / f"{name}.jinja").read_text()
    tok = _hf_tokenizer(template, SPECIALS[name])
    messages = CONVERSATIONS[conversation]
    ours = ChatTemplate(template, tok.special_tokens_map)
    try:
        expected = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except jinja2.TemplateError as e:  # the template's raise_exception: ours must refuse with its message
        with pytest.raises(ChatTemplateError) as refused:
            ours.render(messages)
        assert str(e) in str(refused.value)
        return
    assert ours.render(messages) == expected
    assert ours.render(messages, add_generation_prompt=False) == tok.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=False)


@pytest.mark.parametrize("name,messages,match", [
    ("gemma-2-it", CONVERSATIONS["system+user"], "System role not supported"),
    ("gemma-3-it", CONVERSATIONS["two users in a row"], "roles must alternate"),
    ("mistral-nemo-instruct-2407", [{"role": "assistant", "content": "hi"}], "roles must alternate"),
])
def test_a_template_refusing_the_role_order_is_a_chat_template_error(name, messages, match):
    template = ChatTemplate((TEMPLATES / f"{name}.jinja").read_text(), SPECIALS[name])
    with pytest.raises(ChatTemplateError, match=match):
        template.render(messages)


@pytest.mark.parametrize("name", sorted(SPECIALS))
def test_export_checks_the_template_renders_as_in_transformers(name, monkeypatch):
    from specrt.export.exporter import check_chat_template

    tok = _hf_tokenizer((TEMPLATES / f"{name}.jinja").read_text(), SPECIALS[name])
    check_chat_template(tok, tok.special_tokens_map)
    monkeypatch.setattr(ChatTemplate, "render", lambda self, messages, **kw: "<|im_start|>something else")
    with pytest.raises(ChatTemplateError, match="differently from transformers"):
        check_chat_template(tok, tok.special_tokens_map)


@pytest.mark.parametrize("source", [
    # loopcontrols, the generation tag, tojson with options, namespace, dict()
    "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content }}{% endfor %}"
    "{% generation %}[{{ messages | length }}]{% endgeneration %}",
    "{{ messages | tojson(indent=2, sort_keys=true) }}{{ {'k': '<é>'} | tojson }}",
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}"
    "{{ dict(a=1) | tojson }}{{ tools is none }}{{ documents is none }}{{ add_generation_prompt }}",
    "{{ strftime_now('%Y') }} {{ eos_token }}",
])
def test_jinja_features_render_as_in_transformers(source):
    tok = _hf_tokenizer(source, {})
    messages = CONVERSATIONS["multi-turn"]
    assert ChatTemplate(source, tok.special_tokens_map).render(messages) == tok.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True)


@pytest.mark.parametrize("source,match", [
    ("{{ messages.__class__.__mro__ }}", "SecurityError|UndefinedError"),  # the sandbox holds
    ("{% set ns = namespace(_x=1) %}", "underscore"),
    ("{{ messages[0].content.upper() + 1 }}", "TypeError"),
])
def test_unsafe_or_broken_templates_fail_cleanly(source, match):
    with pytest.raises(ChatTemplateError, match=match):
        ChatTemplate(source).render(CONVERSATIONS["user"])


def test_a_template_that_does_not_compile():
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for m in messages %}")


@pytest.mark.parametrize("messages,match", [
    ("hello", "list of"), ([], "empty"), (["hello"], "message 0 must be a dict"),
    ([{"role": "user"}], "string 'content'"), ([{"role": 1, "content": "x"}], "string 'role'"),
    ([{"role": "user", "content": "x", "meta": object()}], "message 0"),
])
def test_bad_messages_are_config_errors(messages, match):
    with pytest.raises(ConfigError, match=match):
        ChatTemplate("{{ messages }}").render(messages)


# --- export and runtime, on a tiny llama whose tokenizer has a ChatML-style template (conftest's chat_bundle) --

MESSAGES = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def fib(n):"}]


@pytest.fixture(scope="module")
def chat_gen(chat_bundle):
    return specrt.load(chat_bundle, threads=1)


def test_the_bundle_keeps_the_template_special_tokens_and_every_end_id(chat_source, chat_bundle):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(chat_source)
    entry = load_manifest(chat_bundle).tokenizer
    assert entry.chat_template == "chat_template.jinja"
    assert (chat_bundle / entry.chat_template).read_text() == CHAT_TEMPLATE
    assert {1, tok.convert_tokens_to_ids("<|im_end|>")} <= set(entry.eos_token_ids)
    assert entry.special_tokens == {"bos_token": "<s>", "eos_token": "</s>"}


def test_chat_prompt_equals_transformers(chat_source, chat_gen):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(chat_source)
    assert chat_gen.render_chat(MESSAGES) == tok.apply_chat_template(MESSAGES, tokenize=False,
                                                                     add_generation_prompt=True)
    # The template writes BOS: no second one; <|im_start|> text encodes as its special token.
    expected = tok.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True)["input_ids"]
    assert chat_gen.encode_chat(MESSAGES) == expected and expected.count(0) == 1


def test_chat_and_stream_chat_give_the_same_reply(chat_gen):
    out = chat_gen.chat(MESSAGES, max_new_tokens=12, method="ngram")
    assert out.text and out.token_ids and out.finish_reason in ("length", "eos")
    assert "".join(chat_gen.stream_chat(MESSAGES, max_new_tokens=12, method="ngram")) == out.text
    # The reply is the continuation of the encoded conversation, exactly as a token-level generation.
    plain = chat_gen.stream_ids(chat_gen.encode_chat(MESSAGES), max_new_tokens=12, method="none")
    assert "".join(plain) == out.text


def test_chat_imports_no_torch_or_transformers(chat_bundle):
    assert_loads_no_torch(chat_bundle, "g.chat([{'role': 'user', 'content': 'hi'}], max_new_tokens=4, method='none')")


def test_generation_stops_at_the_end_of_turn_id(chat_bundle, tmp_path):
    gen = specrt.load(chat_bundle, threads=1)
    ids = gen.chat(MESSAGES, max_new_tokens=8, method="none").token_ids
    # A bundle whose end ids include the 3rd generated token stops right before it (as an eot would).
    bundle = tmp_path / "b"
    shutil.copytree(chat_bundle, bundle)
    manifest = json.loads((bundle / "specrt.json").read_text())
    manifest["tokenizer"]["eos_token_ids"].append(ids[2])
    (bundle / "specrt.json").write_text(json.dumps(manifest))
    out = specrt.load(bundle, threads=1).chat(MESSAGES, max_new_tokens=8, method="none")
    assert out.finish_reason == "eos" and out.token_ids == ids[:ids.index(ids[2])]


def test_bos_is_added_once_when_the_template_does_not_write_it(chat_bundle, tmp_path):
    bundle = tmp_path / "b"
    shutil.copytree(chat_bundle, bundle)
    (bundle / "chat_template.jinja").write_text(CHAT_TEMPLATE.replace("{{ bos_token }}", ""))
    ids = specrt.load(bundle, threads=1).encode_chat(MESSAGES)
    assert ids[0] == 0 and ids.count(0) == 1


def test_a_bundle_without_template_says_so(chat_bundle, tmp_path):
    # An older manifest: no chat_template, no special_tokens; it still loads and generates.
    bundle = tmp_path / "old"
    shutil.copytree(chat_bundle, bundle)
    manifest = json.loads((bundle / "specrt.json").read_text())
    del manifest["tokenizer"]["chat_template"], manifest["tokenizer"]["special_tokens"]
    (bundle / "specrt.json").write_text(json.dumps(manifest))
    (bundle / "chat_template.jinja").unlink()
    gen = specrt.load(bundle, threads=1)
    assert gen.manifest.tokenizer.chat_template is None and gen.manifest.tokenizer.special_tokens == {}
    assert gen.generate("def f", max_new_tokens=4, method="none").token_ids
    with pytest.raises(ConfigError, match="has no chat template.*export an instruct model"):
        gen.chat(MESSAGES)
    res = CliRunner().invoke(main, ["run", "--chat", "hi", "--bundle", str(bundle), "--method", "none"])
    errors = [line for line in res.output.splitlines() if line.startswith("Error")]
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert len(errors) == 1 and "has no chat template" in errors[0]


def test_a_missing_template_file_is_an_incomplete_bundle(chat_bundle, tmp_path):
    bundle = tmp_path / "b"
    shutil.copytree(chat_bundle, bundle)
    (bundle / "chat_template.jinja").unlink()
    with pytest.raises(BundleError, match="chat_template.jinja is missing"):
        load_manifest(bundle)


def test_cli_run_chat(chat_bundle, chat_gen):
    args = ["run", "--chat", MESSAGES[1]["content"], "--system", MESSAGES[0]["content"], "--bundle", str(chat_bundle),
            "--method", "ngram", "--max-new-tokens", "12"]
    expected = chat_gen.chat(MESSAGES, max_new_tokens=12, method="ngram")
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert res.output == expected.text + "\n"
    res = CliRunner().invoke(main, [*args, "--json", "--stats", "--baseline"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["text"] == expected.text and out["token_ids"] == expected.token_ids
    assert "tokens per target pass" in res.stderr and "measured speedup" in res.stderr


@pytest.mark.parametrize("args,match", [
    ([], "Missing argument 'PROMPT'"), (["--chat"], "Missing argument 'PROMPT'"),
    (["hello", "--system", "be nice"], "--system needs --chat")])
def test_cli_run_chat_usage_errors(args, match):
    res = CliRunner().invoke(main, ["run", *args])
    assert res.exit_code == 2 and match in res.output


def test_chat_is_a_flag_that_never_swallows_an_option(chat_bundle, chat_gen):
    """`run --chat --method none MSG` once took "--method" as the message; a flag reads PROMPT wherever it stands."""
    expected = chat_gen.chat([MESSAGES[1]], max_new_tokens=6, method="none")
    res = CliRunner().invoke(main, ["run", "--chat", "--method", "none", "--max-new-tokens", "6",
                                    "--bundle", str(chat_bundle), MESSAGES[1]["content"]])
    assert res.exit_code == 0, res.output
    assert res.output == expected.text + "\n"


def test_cli_help_teaches_chat():
    out = CliRunner().invoke(main, ["run", "--help"]).output
    assert "--chat " in out and "--chat MESSAGE" not in out and "--system TEXT" in out and 'specrt run --chat "' in out


def test_a_bundle_without_a_drafter_is_told_so_in_one_line(chat_bundle, close_bundle, caplog, monkeypatch):
    """specrt.load() logs one line (stderr, unless the app configured logging) when auto can only run prompt
    lookup; `run --stats` prints it under its table; a bundle with a drafter hears nothing."""
    import logging

    monkeypatch.setattr(logging.getLogger("specrt.advice"), "disabled", False)  # a CLI test before disabled it
    with caplog.at_level(logging.WARNING, logger="specrt.advice"):
        gen = specrt.load(chat_bundle, threads=1)
        specrt.load(close_bundle, threads=1)
    lines = [r.getMessage() for r in caplog.records if r.name == "specrt.advice"]
    assert lines == [gen.drafter_note] and "no drafter" in lines[0] and "specrt eagle train" in lines[0]
    res = CliRunner().invoke(main, ["run", "--chat", "hi", "--bundle", str(chat_bundle), "--max-new-tokens", "4",
                                    "--stats"])
    assert res.exit_code == 0, res.output
    assert res.stderr.count("note: no drafter in this bundle") == 1
    plain = CliRunner().invoke(main, ["run", "--chat", "hi", "--bundle", str(chat_bundle), "--max-new-tokens", "4"])
    assert "no drafter" not in plain.output
