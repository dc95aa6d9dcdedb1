"""The documentation stays whole: every relative link of README.md and docs/ reaches a file (and a heading, when it
names one), and the settings the functions read are all described."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent_jobs.core import diagram
from agent_jobs.core.transitions import JOB_TRANSITIONS, WORKSPACE_TRANSITIONS
from agent_jobs.settings import Settings
from tests.documentation import REPO, doc_pages, doc_section, doc_text

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")
HEADING = re.compile(r"^#{1,6} (.+?)\s*$")


def _prose_lines(page: Path) -> list[str]:
    """The page's lines outside fenced code blocks (a `# comment` in a shell example is no heading)."""
    lines, fenced = [], False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, inline code marks and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor of `page`'s headings, a repeated heading numbered as GitHub numbers it (`-1`, `-2`)."""
    seen: dict[str, int] = {}
    found = set()
    for line in _prose_lines(page):
        match = HEADING.match(line)
        if match is None:
            continue
        slug = _slug(match.group(1))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def relative_links(page: Path) -> list[str]:
    return [
        target
        for line in _prose_lines(page)
        for target in LINK.findall(line)
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target)  # https:, mailto: ... lead outside the repository
    ]


@pytest.mark.parametrize("page", doc_pages(), ids=lambda page: str(page.relative_to(REPO)))
def test_docs_relative_links_reach_a_file_and_heading(page: Path) -> None:
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists() or REPO not in (linked, *linked.parents):
            broken.append(f"{target}: no such file in the repository")
        elif anchor and (linked.suffix != ".md" or anchor not in anchors(linked)):
            broken.append(f"{target}: {linked.relative_to(REPO)} has no heading #{anchor}")
    assert broken == []


def test_docs_slug_headings_as_github_does(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## `sam local` (for users with Docker)\n\n```sh\n# not a heading\n```\n\n## Title\n")
    assert anchors(page) == {"title", "sam-local-for-users-with-docker", "title-1"}


def test_docs_name_every_setting_the_functions_read() -> None:
    section = doc_section("docs/configuration.md", "Environment of the functions")
    missing = [name.upper() for name in Settings.model_fields if f"`{name.upper()}`" not in section]
    assert missing == []


def test_the_state_diagram_is_the_transition_tables() -> None:
    architecture = doc_text("docs/architecture.md")
    assert architecture.index(diagram.START) < architecture.index(diagram.END)
    assert architecture == diagram.replaced(architecture), "run `make docs`: the transition table changed"
    for row in (*JOB_TRANSITIONS, *WORKSPACE_TRANSITIONS):
        assert f"| {row.action} | {row.source or '(none)'} | {row.target} |" in architecture


def test_readme_opens_with_the_two_commands() -> None:
    opening = doc_text("README.md").splitlines()[:6]
    assert any(line.startswith("make demo   # run the whole system locally") for line in opening)
    assert any(line.startswith("make test   # lint, type-check") for line in opening)
