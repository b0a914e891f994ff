"""The README is the front door and docs/ the rest of the house: the README stays short and opens with the two
commands (the second exactly what `.ci/run` runs), every relative link in the README, docs/ and
benchmarks/RESULTS.md leads to a file (and a heading, where it names one), and every `gputop ...` command the
documentation names, with its options, is one the CLI's parser has."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from gputop.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
DOCUMENTS = [README, *PAGES, ROOT / "benchmarks" / "RESULTS.md"]
MAX_README_LINES = 300

DEMO_COMMAND = "pip install -e '.[demo]' && gputop demo"

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`([^`]+)`")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
OPTION = re.compile(r"(?<![\w-])(--?[a-zA-Z][\w-]*)")


def relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def ci_command() -> str:
    """The command `.ci/run` ends with: what the README's second block must say."""
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.strip()]
    return lines[-1]


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}


def links(path: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", path.read_text()))


def test_the_readme_is_a_front_door_of_at_most_300_lines():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; move detail into a page under docs/"


def test_the_readme_opens_with_the_two_commands_the_second_what_ci_runs():
    lines = README.read_text().splitlines()
    assert lines[0].startswith("# "), "the README starts with its title"
    opening = [line for line in lines[1:12] if line.strip()]
    assert opening[:6] == ["```bash", DEMO_COMMAND, "```", "```bash", ci_command(), "```"], opening[:6]


def test_ci_runs_the_install_and_the_tests():
    assert ci_command() == "pip install -e '.[test]' && python -m pytest"


def test_the_readme_links_every_page_under_docs():
    linked = {(README.parent / target.split("#")[0]).resolve() for target in links(README)}
    unlinked = [relative(page) for page in PAGES if page.resolve() not in linked]
    assert not unlinked, f"pages the README's 'Read more' does not link: {unlinked}"


@pytest.mark.parametrize("document", DOCUMENTS, ids=relative)
def test_every_relative_link_leads_to_a_file_and_its_heading(document):
    broken = []
    for target in links(document):
        if re.match(r"^[a-z]+:", target):  # https:, mailto:: not ours to check offline
            continue
        path, _, anchor = target.partition("#")
        resolved = (document.parent / path).resolve() if path else document
        if not resolved.exists():
            broken.append(f"{target}: no file {resolved.relative_to(ROOT) if resolved.is_relative_to(ROOT) else resolved}")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading #{anchor} in {relative(resolved)}")
    assert not broken, f"{relative(document)}: " + "; ".join(broken)


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def commands_named(path: Path) -> list[str]:
    """Every `gputop ...` in a code span or a line of a code block, as written (one line)."""
    text = path.read_text()
    spans = [" ".join(span.split()) for span in CODE_SPAN.findall(FENCE.sub("", text))]
    blocks = [line.strip() for block in FENCE.findall(text) for line in block.splitlines()]
    found = []
    for candidate in spans + blocks:
        at = candidate.find("gputop ")
        if candidate.startswith(("gputop ", "$ gputop ")) or (at >= 0 and candidate[:at].strip() in ("", "$")):
            found.append(candidate[at:].split("#")[0].strip())
    return found


@pytest.mark.parametrize("document", DOCUMENTS, ids=relative)
def test_every_gputop_command_named_is_one_the_cli_has_with_its_options(document):
    parser = build_parser()
    commands = subcommands(parser)
    wrong = []
    for command in commands_named(document):
        words = command.split()[1:]
        sub = words[0] if words and not words[0].startswith("-") else None
        if sub is not None and sub.isupper():  # `gputop COMMAND --help`: a placeholder for any of them
            continue
        if sub is not None and sub not in commands:
            wrong.append(f"`{command}`: no subcommand {sub!r}")
            continue
        known = {option for action in (commands[sub] if sub else parser)._actions for option in action.option_strings}
        missing = sorted({option for option in OPTION.findall(" ".join(words)) if option not in known})
        if missing:
            wrong.append(f"`{command}`: no option {', '.join(missing)}")
    assert not wrong, f"{relative(document)}: " + "; ".join(wrong)


def test_the_readme_names_every_subcommand():
    named = {command.split()[1] for command in commands_named(README) if len(command.split()) > 1}
    missing = sorted(set(subcommands(build_parser())) - named - {"tui"})  # `gputop` alone is the TUI
    assert not missing, f"subcommands the README's command table leaves out: {missing}"
