"""The README and the mkdocs site under docs/: the site builds with warnings as errors,
every fenced code block is either run here or marked ``<!-- not run: REASON -->`` on the
line above it (other marker comments, such as ``<!-- test-command -->``, may sit in
between), every unmarked Python block runs, and the README stays short. Each check is
also shown to fail on a small bad example."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 250
BLOCK_TIMEOUT_S = 180

FENCE = re.compile(r"^\s*(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)")
COMMENT = re.compile(r"^\s*<!--.*-->\s*$")
NOT_RUN = re.compile(r"^\s*<!--\s*not run:(?P<reason>.*?)-->\s*$")


@dataclass(frozen=True)
class Block:
    where: str  # "README.md:21", the line of the opening fence
    lang: str  # the info string's first word, "" for none
    code: str
    not_run: str | None  # the marker's reason ("" for an empty one), None when unmarked


def code_blocks(text: str, name: str) -> list[Block]:
    """The fenced code blocks of a Markdown text, with the not-run marker above each."""
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence = opening["fence"]
        end = i + 1
        while end < len(lines) and not re.fullmatch(rf"\s*{re.escape(fence[0])}{{{len(fence)},}}\s*", lines[end]):
            end += 1
        if end == len(lines):
            raise ValueError(f"{name}:{i + 1}: a code fence that is never closed")
        reason, above = None, i - 1
        while above >= 0 and COMMENT.match(lines[above]):  # marker comments directly above
            marker = NOT_RUN.match(lines[above])
            if marker:
                reason = marker["reason"].strip()
                break
            above -= 1
        blocks.append(Block(f"{name}:{i + 1}", opening["info"].lower(), "\n".join(lines[i + 1 : end]), reason))
        i = end + 1
    return blocks


def marker_problems(blocks: list[Block]) -> list[str]:
    """Blocks that are neither run (unmarked Python) nor marked not run with a reason."""
    problems = []
    for block in blocks:
        if block.not_run == "":
            problems.append(f"{block.where}: `<!-- not run: REASON -->` without a reason")
        elif block.not_run is None and block.lang != "python":
            problems.append(
                f"{block.where}: a {block.lang or 'plain'} block that is not run needs "
                "`<!-- not run: REASON -->` on the line above it"
            )
    return problems


def doc_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def all_blocks() -> list[Block]:
    return [
        block
        for path in doc_files()
        for block in code_blocks(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    ]


def python_blocks_to_run() -> list[Block]:
    return [block for block in all_blocks() if block.lang == "python" and block.not_run is None]


def run_block(code: str, timeout: float = BLOCK_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )


def too_long(text: str, limit: int = MAX_README_LINES) -> str | None:
    count = len(text.splitlines())
    return f"{count} lines, more than {limit}" if count > limit else None


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


RESULTS = re.compile(r"benchmarks/results/[\w.\-]+\.(?:txt|json)")
LINK = re.compile(r"\]\((?P<target>[^)\s#]+)(?:#[^)]*)?\)")


def prose(text: str) -> str:
    """The text without its fenced code blocks (whose commands may name files they write)."""
    lines, kept, fence = text.splitlines(), [], None
    for line in lines:
        opening = FENCE.match(line)
        if fence is None and opening:
            fence = opening["fence"]
        elif fence is not None and re.fullmatch(rf"\s*{re.escape(fence[0])}{{{len(fence)},}}\s*", line):
            fence = None
        elif fence is None:
            kept.append(line)
    return "\n".join(kept)


def missing_files(text: str, base: Path) -> list[str]:
    """Relative link targets and benchmarks/results/ files named in a text's prose that do
    not exist."""
    text = prose(text)
    missing = [name for name in RESULTS.findall(text) if not (ROOT / name).exists()]
    missing += [
        target
        for target in LINK.findall(text)
        if "://" not in target and not target.startswith("mailto:") and not (base / target).exists()
    ]
    return missing


# -- the site builds, warnings as errors --------------------------------------------------


def test_the_docs_build_with_warnings_as_errors(tmp_path):
    result = mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "index.html").exists()


def test_the_build_check_fails_on_a_broken_link(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n\nSee [nowhere](nowhere.md).\n")
    (tmp_path / "mkdocs.yml").write_text("site_name: broken\n")
    result = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0 and "nowhere.md" in result.stdout + result.stderr


def test_every_docs_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    assert [page.name for page in sorted(DOCS.glob("*.md")) if page.name not in nav] == []


# -- every code block is run or marked -----------------------------------------------------


def test_every_code_block_is_run_or_marked_not_run():
    blocks = all_blocks()
    assert len({block.where.split(":")[0] for block in blocks}) >= 5, "too few files with code blocks"
    assert marker_problems(blocks) == []


def test_the_marker_check_finds_unmarked_and_unexplained_blocks():
    lines = (
        "Run this:",
        "",
        "```bash",
        "rm -rf /",
        "```",  # 3: unmarked
        "<!-- not run: -->",
        "```",
        "train",
        "```",  # 7: no reason
        "<!-- not run: starts a server -->",
        "",
        "```bash",
        "serve",
        "```",  # 12: blank between
        "<!-- not run: trains for minutes -->",
        "<!-- main-command -->",
        "```",
        "train",
        "```",  # ok
        "```python",
        "print(1)",
        "```",  # run, ok
        "<!-- not run: needs a GPU -->",
        "~~~python",
        "import torch",
        "~~~",  # ok
    )
    blocks = code_blocks("\n".join(lines), "t.md")
    assert [block.where for block in blocks] == ["t.md:3", "t.md:7", "t.md:12", "t.md:17", "t.md:20", "t.md:24"]
    assert [block.not_run for block in blocks] == [None, "", None, "trains for minutes", None, "needs a GPU"]
    problems = marker_problems(blocks)
    assert [problem.split(":", 2)[1] for problem in problems] == ["3", "7", "12"]
    with pytest.raises(ValueError, match="never closed"):
        code_blocks("```python\nprint(1)\n", "t.md")


@pytest.mark.parametrize("block", python_blocks_to_run(), ids=lambda block: block.where)
def test_a_python_block_of_the_docs_runs(block):
    result = run_block(block.code)
    assert result.returncode == 0, f"{block.where}\n{block.code}\n{result.stdout}{result.stderr}"


def test_the_run_check_fails_on_a_failing_block():
    assert run_block("undefined_name").returncode != 0
    assert run_block("import empathy_gym").returncode == 0  # the repository root is the cwd


def test_the_docs_have_python_blocks_to_run():
    wheres = [block.where for block in python_blocks_to_run()]
    assert any(where.startswith("README.md:") for where in wheres), wheres


# -- the README ----------------------------------------------------------------------------


def test_the_readme_is_short():
    assert too_long(README.read_text(encoding="utf-8")) is None


def test_the_length_check_fails_on_a_long_text():
    assert too_long("line\n" * MAX_README_LINES) is None
    assert too_long("line\n" * (MAX_README_LINES + 1)) == "251 lines, more than 250"


def test_the_readme_keeps_one_test_command_between_its_markers():
    # .ci/run takes the lines between the markers, less comment and fence lines.
    text = README.read_text(encoding="utf-8")
    section = re.search(r"<!-- test-command -->\n(.*?)<!-- /test-command -->", text, re.DOTALL)
    assert section, "README.md lost its <!-- test-command --> markers"
    command = [
        line for line in section[1].splitlines() if line and not line.startswith("<!--") and not line.startswith("```")
    ]
    assert len(command) == 1 and "pytest" in command[0], command


def test_linked_files_and_results_files_exist():
    for path in doc_files():
        text = path.read_text(encoding="utf-8")
        assert missing_files(text, path.parent) == [], path


def test_the_file_check_fails_on_a_missing_file():
    text = (
        "[results](benchmarks/results/heldout_seeds.txt), `benchmarks/results/nothing_here.txt`, "
        "[docs](docs/no_such_page.md#part), [paper](https://arxiv.org/abs/2507.03112)\n"
        "```bash\npython bench.py --out benchmarks/results/written_by_the_command.txt\n```"
    )
    assert missing_files(text, ROOT) == ["benchmarks/results/nothing_here.txt", "docs/no_such_page.md"]


def test_the_evaluation_page_states_the_reply_cap_of_local_policies():
    # before: "no cap on the length of the agent's replies", where eval caps hf: policies
    from empathy_gym.evaluation.policies import LOCAL_MAX_TOKENS

    text = " ".join((DOCS / "evaluation.md").read_text(encoding="utf-8").split())
    assert f"whose replies stop at {LOCAL_MAX_TOKENS} new tokens unless `--max-tokens`" in text
