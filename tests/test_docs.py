"""The README and docs/: every relative link and image resolves, and the README stays a front door.

A link `[text](target)` or image `![alt](target)` whose target is not a URL must name a file or folder
that exists, relative to the page; a `#fragment` on a markdown target must be one of its headings
(GitHub's anchors: lower case, punctuation dropped, spaces to hyphens). Links inside code blocks and
inline code are not links.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 300

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~)")
INLINE_CODE = re.compile(r"`+[^`]*`+")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # https:, mailto:, file: ...


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def prose_lines(text: str, *, keep_code: bool = False) -> list[str]:
    """The page's lines outside fenced code blocks, with inline code removed unless `keep_code`."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line if keep_code else INLINE_CODE.sub("", line))
    return out


def links(text: str) -> list[str]:
    return [m.group(1) for line in prose_lines(text) for m in LINK.finditer(line)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in prose_lines(text, keep_code=True):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(page: Path) -> list[str]:
    """Each relative link of `page` that does not resolve, with why."""
    text = page.read_text(encoding="utf-8")
    bad = []
    for target in links(text):
        if EXTERNAL.match(target):
            continue
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest} does not exist")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest.read_text(encoding="utf-8")):
            bad.append(f"{target}: {dest.name} has no heading with the anchor #{fragment}")
    return bad


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    assert broken_links(page) == []


def test_pages_have_links():
    """The parser finds the README's links and images (a parser that finds none would pass everything)."""
    found = links((ROOT / "README.md").read_text(encoding="utf-8"))
    assert "docs/algorithm.md" in found
    assert any(t.endswith(".png") for t in found)
    assert len(pages()) >= 8


def test_readme_is_short():
    n = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; move detail into a docs/ page (at most {README_MAX_LINES})"


def test_broken_link_is_found(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("# A heading: with `code`\n", encoding="utf-8")
    page.write_text(
        "[ok](there.md) [ok](there.md#a-heading-with-code) ![img](missing.png)\n"
        "[bad](there.md#nope) [web](https://example.org/x) `[code](nowhere.md)`\n"
        "```\n[fenced](nowhere.md)\n```\n",
        encoding="utf-8",
    )
    text = page.read_text(encoding="utf-8")
    assert links(text) == [
        "there.md",
        "there.md#a-heading-with-code",
        "missing.png",
        "there.md#nope",
        "https://example.org/x",
    ]
    bad = broken_links(page)
    assert len(bad) == 2
    assert bad[0].startswith("missing.png:") and "does not exist" in bad[0]
    assert bad[1].startswith("there.md#nope:") and "no heading" in bad[1]
