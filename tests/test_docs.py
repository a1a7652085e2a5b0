"""The README and docs stay true: relative links resolve, shown commands run (``RUN``) or are listed with a reason
(``NOT_RUN``) and print what is shown, config and example excerpts match their files, headline figures their sources."""

from __future__ import annotations

import doctest
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml
from paths import ROOT

LINKED_PAGES = sorted([ROOT / "README.md", ROOT / "trl_padfree/demo/README.md", *ROOT.glob("docs/**/*.md")])
# Pages whose shown commands are kept true here (usage, distributed, benchmark test their own commands).
COMMAND_PAGES = ["README.md"] + [f"docs/{name}.md" for name in (
    "api", "attention", "collator", "dpo", "development", "head", "launch", "probe", "probe-families", "results",
    "real-tokenizers", "templates")]
COMMAND_STARTS = ("trl-padfree", "python", "accelerate", "bash")

# A few training steps instead of a run to the end: later command-line values win over earlier ones.
FEW_STEPS = ("--max_steps 2 --max_train_examples 32 --max_eval_examples 8 --eval_strategy no --eval_on_start false "
             "--save_strategy no --output_dir {tmp}/out")
# shown command -> (what the test appends, expected exit code)
RUN: dict[str, tuple[str, int]] = {
    "trl-padfree train --config configs/demo.yaml": (FEW_STEPS, 0),
    "trl-padfree train --config configs/demo.yaml --max_steps 20 --output_dir /tmp/run": (FEW_STEPS, 0),
    "python scripts/train.py --config configs/demo.yaml": (FEW_STEPS, 0),
    "trl-padfree train --help": ("", 0),
    "trl-padfree train --config configs/demo.yaml --learning_rat 1e-3": ("", 2),
    "trl-padfree check --model trl_padfree/demo/model": ("", 0),
    "trl-padfree preview --config configs/demo.yaml -n 1": ("", 0),
    "trl-padfree preview --config configs/demo.yaml -n 3": ("", 0),
    "trl-padfree preview --config configs/demo-dpo.yaml -n 2": ("", 0),
    "trl-padfree dpo --config configs/demo-dpo.yaml": (FEW_STEPS, 0),
    "trl-padfree preview --config configs/demo-grpo.yaml -n 2": ("", 0),
    "trl-padfree grpo --config configs/demo-grpo.yaml": (FEW_STEPS, 0),
    "trl-padfree reward --config configs/demo-reward.yaml": (FEW_STEPS, 0),
    "trl-padfree kto --config configs/demo-kto.yaml": (FEW_STEPS, 0),
    # three families instead of 60 (one of each table's), written to a temporary file, compared with the page below
    "python scripts/probe_families.py": ("--types llama,opt,bloom --out {tmp}/families.md", 0),
}
# shown command -> why the test does not run it
NOT_RUN: dict[str, str] = {
    "trl-padfree check --model path/or/hub-name [--attn-implementation auto|padfree|sdpa|eager|flash_attention_2|default]": (
        "a synopsis with placeholders; the runnable form is run above"
    ),
}


class Shown(NamedTuple):
    """A command shown in a fenced block, with the output shown after it (``$`` blocks) if any."""

    page: str
    line: int
    command: str
    output: str | None

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.command}"


FENCE = re.compile(r"^(?P<fence>```+)(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=fence)[ \t]*$", re.M | re.S)


def fenced_blocks(text: str) -> list[tuple[str, str, int]]:
    """``(language, body, line number of the body's first line)`` of each fenced block."""
    return [(m["lang"], m["body"], text.count("\n", 0, m.start("body")) + 1) for m in FENCE.finditer(text)]


def strip_comment(line: str) -> str:
    """A shell line without its trailing ``# comment`` (quotes respected)."""
    for cut in (i for i, char in enumerate(line) if char == "#"):
        before = line[:cut]
        if (cut == 0 or before[-1].isspace()) and before.count('"') % 2 == 0 and before.count("'") % 2 == 0:
            return before.rstrip()
    return line.rstrip()


def shown_commands(page: str) -> list[Shown]:
    """The commands of a page's shell and text blocks; in a block with ``$ `` lines, each one's output."""
    found = []
    for lang, body, first in fenced_blocks((ROOT / page).read_text(encoding="utf-8")):
        if lang not in {"", "bash", "sh", "shell", "console", "text"}:
            continue
        lines = body.splitlines()
        dollar = any(line.startswith("$ ") for line in lines)
        for i, raw in enumerate(lines):
            if dollar and not raw.startswith("$ "):
                continue  # output
            command = strip_comment(raw.removeprefix("$ "))
            output = None
            if dollar:
                end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("$ ")), len(lines))
                output = "\n".join(lines[i + 1 : end]).strip("\n") or None
            if command.startswith(COMMAND_STARTS):
                found.append(Shown(page, first + i, command, output))
    return found


ALL_SHOWN = [shown for page in COMMAND_PAGES for shown in shown_commands(page)]


def anchors(path: Path) -> set[str]:
    """GitHub's anchors for the page's Markdown headings."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {re.sub(r"[^\w\- ]", "", m[1].strip().lower()).replace(" ", "-")
            for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M)}


LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")


@pytest.mark.parametrize("page", LINKED_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path):
    broken, text = [], re.sub(r"`[^`\n]*`", "", FENCE.sub("", page.read_text(encoding="utf-8")))  # outside code
    for target in (m["target"] for m in LINK.finditer(text) if not re.match(r"^[a-z][a-z0-9+.-]*:", m["target"], re.I)):
        file_part, _, fragment = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"{target} (no such file: {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest})")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target} (no heading with anchor #{fragment} in {dest.name})")
    assert not broken, f"broken links in {page.relative_to(ROOT)}: " + "; ".join(broken)


def test_every_shown_command_is_run_or_listed_with_a_reason():
    unaccounted = [str(s) for s in ALL_SHOWN if s.command not in RUN and s.command not in NOT_RUN]
    assert not unaccounted, (
        "commands shown in the docs that this test neither runs nor lists: " + "; ".join(unaccounted)
        + ". Add each to RUN (with a cheap variant) or NOT_RUN (with the reason) in tests/test_docs.py."
    )
    stale = sorted((set(RUN) | set(NOT_RUN)) - {s.command for s in ALL_SHOWN})
    assert not stale, f"RUN / NOT_RUN list commands no page shows any more: {stale}"


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    setup = readme.index("## Set up and run (fresh machine)")
    first_block = next(body for lang, body, _ in fenced_blocks(readme[setup:]))
    assert [strip_comment(line) for line in first_block.splitlines()] == ["make demo", "make test"]
    assert re.search(r"^make test$", (ROOT / ".ci" / "run").read_text(encoding="utf-8"), re.M)


def run_shown(command: str, extra: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """(exit code, output) of a shown command run from the root (``trl-padfree`` in-process)."""
    argv = shlex.split(command) + shlex.split(extra.format(tmp=tmp_path))
    if argv[0] == "trl-padfree":
        from trl_padfree.cli import main

        cwd = os.getcwd()
        os.chdir(ROOT)
        try:
            code = main(argv[1:])
        except SystemExit as exc:  # argparse --help
            code = exc.code if isinstance(exc.code, int) else 0
        finally:
            os.chdir(cwd)
        out, err = capfd.readouterr()
        return code, out + err
    assert argv[0] == "python", command
    proc = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize("shown", [s for s in ALL_SHOWN if s.command in RUN], ids=str)
def test_shown_command_runs_and_prints_what_the_page_shows(shown: Shown, tmp_path, capfd):
    extra, expected_code = RUN[shown.command]
    code, output = run_shown(shown.command, extra, tmp_path, capfd)
    assert code == expected_code, f"{shown} exited {code}, expected {expected_code}:\n{output[-3000:]}"
    if shown.output is not None:
        # the command's own lines (transformers' progress bars and warnings around them are not shown)
        own = "\n".join(line for line in output.splitlines() if not line.startswith(("Loading weights", "\r")))
        # doctest's comparison: "..." matches any text, runs of whitespace compare equal
        assert doctest.OutputChecker().check_output(shown.output.strip() + "\n", own.strip() + "\n",
                                                    doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE), (
            f"{shown}: the page shows\n{shown.output}\nbut it printed\n{own}")
    if extra == FEW_STEPS and expected_code == 0:  # the run really trained and wrote its summary
        assert (tmp_path / "out" / "launch_summary.json").is_file(), output[-3000:]
    if shown.command == "trl-padfree train --help":
        assert output.startswith("usage: trl-padfree train"), output[:500]
    if shown.command == "python scripts/probe_families.py":
        # the two tables' headers, llama's group and each family's row, as on the page, rounding differences (their
        # last digits vary by CPU) masked
        rows = [re.sub(r"\d\.\de[+-]\d\d", "N", line) for line in (tmp_path / "families.md").read_text().splitlines()
                if line.startswith("| ")]
        page = re.sub(r"\d\.\de[+-]\d\d", "N", (ROOT / "docs" / "probe-families.md").read_text()).splitlines()
        assert len(rows) == 6 and all(row in page for row in rows), rows


def config_blocks() -> list[tuple[str, str, dict]]:
    """``(page, config file, the keys shown)`` of each ``yaml`` block headed ``# configs/NAME.yaml``."""
    return [(page, head[1], yaml.safe_load(body)) for page in COMMAND_PAGES
            for lang, body, _ in fenced_blocks((ROOT / page).read_text(encoding="utf-8"))
            if lang == "yaml" and (head := re.match(r"#\s*(configs/\S+\.ya?ml)", body))]


@pytest.mark.parametrize("page,config,shown", config_blocks(), ids=lambda v: v if isinstance(v, str) else "")
def test_shown_config_excerpt_matches_the_file(page, config, shown):
    real = yaml.safe_load((ROOT / config).read_text(encoding="utf-8"))
    wrong = {k: (v, real.get(k, "<missing>")) for k, v in shown.items() if real.get(k, "<missing>") != v}
    assert not wrong, f"{page} shows {config} with values the file does not have (shown, real): {wrong}"


def python_excerpts() -> list[tuple[str, str]]:
    """``(page, body)`` of each ``python`` block that is headed ``# examples/NAME.py``."""
    return [(page, body) for page in COMMAND_PAGES
            for lang, body, _ in fenced_blocks((ROOT / page).read_text(encoding="utf-8"))
            if lang == "python" and body.startswith("# examples/")]


def test_readme_shows_the_example_script():
    blocks = [body for lang, body, _ in fenced_blocks((ROOT / "README.md").read_text()) if lang == "python"]
    assert blocks and blocks[0].startswith("# examples/sft_padfree.py"), "the README's first Python is its excerpt"
    assert all(body.startswith("# examples/") for body in blocks), "the README's Python blocks are example excerpts"


@pytest.mark.parametrize("page,body", python_excerpts(), ids=lambda v: v if v.endswith(".md") else "")
def test_python_shown_is_an_excerpt_of_the_example(page, body):
    """Every line shown is a line of the script, in the script's order (``...`` stands for lines left out)."""
    name = body.splitlines()[0].split()[1]  # "# examples/NAME.py (abridged)"
    example = (ROOT / name).read_text(encoding="utf-8").splitlines()
    position = 0
    for line in body.splitlines()[1:]:
        if not line.strip() or line.strip() == "...":
            continue
        assert line in example[position:], f"{page}: line not in {name} (in order): {line!r}"
        position = example.index(line, position) + 1


def padfree_rows(report: str) -> list[tuple[str, str]]:
    """``(real tokens/s vs padded, peak memory vs padded)`` of each ``packed-padfree`` row of a bench report."""
    rows, speed, memory = [], 2, 9
    for line in (ROOT / report).read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "variant":  # the columns by their headers: "vs padded" after tokens/s, after peak memory
            speed, memory = cells.index("real tokens/s") + 1, cells.index("peak memory (MB)") + 1
        if cells[0] == "packed-padfree":
            rows.append((cells[speed], cells[memory]))
    return rows


def test_readme_headline_figures_are_those_of_their_sources():
    """The README's results table quotes the bench reports and the real-tokenizer count as they are."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = {line.split("|")[1].strip(): line for line in readme.splitlines() if line.startswith("| ")}
    for row, report in (("CPU, 2 cores, tiny Llama", "docs/bench/cpu.md"), ("one H200, 0.49B Llama, bf16", "docs/bench/cuda.md")):
        (flan_speed, flan_mem), (orca_speed, orca_mem) = padfree_rows(report)  # FLAN-like, then OrcaMath-like
        for shown in (f"**{flan_speed}**", f"**{orca_speed}**", f"{flan_mem} / {orca_mem}"):
            assert shown in table[row], f"README row {row!r} does not show {shown} from {report}"
    native = (ROOT / "docs" / "benchmark.md").read_text(encoding="utf-8")
    for figure in re.findall(r"\*\*[^*]+\*\*", table["vs TRL 1.16's own padding-free path (CPU, `SFTTrainer`)"]):
        assert figure in native, f"README's trl-native figure {figure} is not in docs/benchmark.md"
    counts = re.search(r"^\| all \|[^|]*\| (\d+) / (\d+) \|", (ROOT / "docs" / "real-tokenizers.md").read_text(), re.M)
    assert counts and f"{counts[1]} / {counts[2]} examples" in table["labels"]
