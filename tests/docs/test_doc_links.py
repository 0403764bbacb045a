"""Every relative link in README.md and docs/*.md leads somewhere: the file or
directory exists, and a `#fragment` names a heading of the Markdown file it
points into (GitHub's anchors: lower case, punctuation dropped, spaces as
dashes, `-1`, `-2` … for repeats). Reference moves between files; a link left
pointing at the old place fails here."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from tests.system.helpers import REPO_ROOT

PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!\\)\[(?:[^\]]|\\\])*\]\(([^)\s]+)\)")


def prose(markdown: str) -> str:
    """The text outside fenced code blocks and inline code."""
    kept, fenced = [], False
    for line in markdown.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            kept.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(kept)


def anchors(page: Path) -> set[str]:
    seen: Counter[str] = Counter()
    found = set()
    fenced = False
    for line in page.read_text().split("\n"):
        if line.startswith("```"):
            fenced = not fenced
            continue
        heading = re.match(r"^#{1,6} (.*)$", line)
        if fenced or not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        found.add(f"{slug}-{seen[slug]}" if seen[slug] else slug)
        seen[slug] += 1
    return found


def links(page: Path) -> list[str]:
    return [
        target
        for target in LINK.findall(prose(page.read_text()))
        if not re.match(r"^[a-z]+:", target)  # http:, https:, mailto:
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO_ROOT)))
def test_every_relative_link_leads_somewhere(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, fragment = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif fragment and destination.suffix == ".md" and fragment not in anchors(destination):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{page.relative_to(REPO_ROOT)}:\n" + "\n".join(broken)


def test_the_checker_sees_links() -> None:
    readme = links(REPO_ROOT / "README.md")
    assert "docs/jobs.md" in readme and "docs/operations.md#the-drain" in readme
