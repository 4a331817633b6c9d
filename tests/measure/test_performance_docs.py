"""The measurement tables in README.md and docs/ are the ones benchmarks/*/*.json give, and docs/performance/
has a page, with its command, JSON file, date and machine, for every measurement; benchmarks/ is laid out by
topic, each folder holding its runners, its JSON and a README.md that benchmarks/README.md lists."""

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = ROOT / "docs" / "performance"
BENCH = ROOT / "benchmarks"
NOT_RESULTS = {"heads", "prompts"}  # what the package and users read (heads' configs, prompt lists), not measurements
NAMED = re.compile(r"benchmarks/[\w./-]+\.json")  # a JSON file named by its path: benchmarks/TOPIC/FILE.json


def _load_tables():
    spec = importlib.util.spec_from_file_location("benchmark_tables", BENCH / "tables" / "tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tables = _load_tables()
pages = sorted(p for p in PAGES.glob("*.md") if p.name != "index.md" and not p.name.startswith("_"))


def _results() -> list[Path]:
    """Every measurement JSON under benchmarks/ (any depth), heads' and prompts' files aside."""
    return sorted(p for p in BENCH.rglob("*.json") if p.relative_to(BENCH).parts[0] not in NOT_RESULTS)


def _is_result(named: str) -> bool:
    return Path(named).parts[1] not in NOT_RESULTS


def test_generated_blocks_match_the_json():
    problems = tables.check(ROOT)
    assert not problems, "\n".join(problems)


def test_every_table_renders_and_fits_its_place():
    for name in tables.TABLES:
        lines = tables.render(name).splitlines()
        assert len(lines) >= 3 and all(line.startswith("|") and line.endswith("|") for line in lines), name
        assert len({line.count("|") for line in lines}) == 1, f"{name}: rows and header differ in columns"
    headline = tables.render("demo-cpu").splitlines()[0]
    assert headline.count("|") - 1 <= 7, "the README's headline table has more than 7 columns"


def test_check_names_a_drifting_block_and_the_fix(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("<!-- generated: demo-cpu -->\n| stale |\n<!-- end generated -->\n"
                                        "<!-- generated: no-such-table -->\n<!-- end generated -->\n")
    problems = tables.check(tmp_path)
    assert any("'demo-cpu'" in p and tables.FIX in p for p in problems), problems
    assert any("'no-such-table'" in p for p in problems), problems
    tables.write(tmp_path)
    assert [p for p in tables.check(tmp_path) if "'demo-cpu'" in p] == []


@pytest.mark.parametrize("page", pages, ids=lambda p: p.name)
def test_page_names_its_json_command_date_and_machine(page):
    text = page.read_text()
    named = set(NAMED.findall(text))
    assert any(map(_is_result, named)), f"{page.name} names no benchmarks/TOPIC/*.json file"
    missing = sorted(f for f in named if not (ROOT / f).is_file())
    assert not missing, f"{page.name} names JSON files that do not exist: {missing}"
    assert "**Command**" in text and "```bash\n" in text, f"{page.name} gives no command in a ```bash block"
    assert re.search(r"\*\*Date:\*\* \d{4}-\d{2}-\d{2}", text), f"{page.name} gives no **Date:** YYYY-MM-DD"
    assert "**Machine:**" in text, f"{page.name} gives no **Machine:**"
    assert tables.blocks(text), f"{page.name} has no generated table"
    assert f"]({page.name})" in (PAGES / "index.md").read_text(), f"docs/performance/index.md does not link {page.name}"


def test_every_benchmark_json_has_a_page():
    covered = {f for page in pages for f in NAMED.findall(page.read_text())}
    results = [p.relative_to(ROOT).as_posix() for p in _results()]
    assert len(results) > 100, f"found only {len(results)} JSON files under benchmarks/"
    missing = sorted(f for f in results if f not in covered)
    assert not missing, f"no docs/performance page names {missing}"


def test_benchmarks_are_laid_out_by_topic():
    """No loose JSON or runner at benchmarks/'s top level; every folder has a README.md the top one links."""
    loose = sorted(p.name for p in BENCH.iterdir() if p.is_file() and p.name != "README.md")
    assert not loose, f"benchmarks/ has files outside a topic folder: {loose}"
    top = (BENCH / "README.md").read_text()
    for folder in sorted(p for p in BENCH.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))):
        assert (folder / "README.md").is_file(), f"benchmarks/{folder.name}/ has no README.md"
        assert f"]({folder.name}/)" in top, f"benchmarks/README.md does not link {folder.name}/"
    for path in _results():
        assert path.parent.parent == BENCH, f"{path.relative_to(ROOT)}: results sit one folder deep, by topic"
        named_here = re.search(rf"(?<![\w.-]){re.escape(path.name)}", (path.parent / "README.md").read_text())
        assert named_here, f"benchmarks/{path.parent.name}/README.md does not name {path.name}"


def test_every_table_appears_in_some_page():
    shown = {name for page in pages for name, _ in tables.blocks(page.read_text())}
    assert set(tables.TABLES) <= shown, f"tables shown nowhere in docs/performance: {set(tables.TABLES) - shown}"
