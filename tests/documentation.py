"""The repository's documentation as tests read it: README.md and the pages under docs/."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def doc_pages() -> list[Path]:
    """README.md and every Markdown page under docs/, in a stable order."""
    return [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]


def doc_text(page: str) -> str:
    """The text of `page`, a path relative to the repository root (e.g. "docs/operations.md")."""
    return (REPO / page).read_text()


def doc_section(page: str, title: str) -> str:
    """The section of `page` under the heading `title` (any level), up to the next heading of the same or a higher
    level. Raises ValueError when the page has no such heading, so a moved section fails loudly."""
    match = re.search(rf"^(#+) {re.escape(title)}\n", doc_text(page), flags=re.MULTILINE)
    if match is None:
        raise ValueError(f"{page} has no heading {title!r}")
    rest = doc_text(page)[match.end() :]
    end = re.search(rf"^#{{1,{len(match.group(1))}}} ", rest, flags=re.MULTILINE)
    return rest if end is None else rest[: end.start()]
