"""The docs stand alone: every link and every ``docs/…#section`` citation in the repository leads to a
file of the repository and a heading that exists, so a reader (or a renamed heading) never meets a dead
end, and nothing points at documents users do not have."""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKDOWN_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# A citation in code, comments, docstrings or templates: docs/api.md#errors, README.md#production.
CITATION = re.compile(r"(?<![\w/.-])((?:docs/[\w-]+|README|deploy/README)\.md)(#[\w-]+)?")
EXTERNAL = ("http://", "https://", "mailto:")
TEXT_SUFFIXES = {".py", ".md", ".html", ".toml", ".sh", ".txt", ".js", ".mjs", ".css", ".cfg", ".service"}
TEXT_NAMES = {"Makefile", "Procfile"}
# The internal specification the code once cited; users never have it (built so this file is no hit).
INTERNAL_SPEC, SHARED_DOCS = "CONTRACT" + " §", "shared" + "/docs"


@cache
def tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    paths = [ROOT / name for name in names.splitlines()]
    return [p for p in paths if (p.suffix in TEXT_SUFFIXES or p.name in TEXT_NAMES) and p.is_file()]


@cache
def anchors(markdown: Path) -> frozenset[str]:
    """The ids GitHub gives the headings of a Markdown file (lowercase, punctuation dropped, spaces →
    hyphens, ``-1``, ``-2`` … for repeats), fenced code left out."""
    seen: dict[str, int] = {}
    ids = set()
    fenced = False
    for line in markdown.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        heading = re.match(r"#{1,6} (.+)", line)
        if fenced or not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        ids.add(slug if count == 0 else f"{slug}-{count}")
    return frozenset(ids)


def _problem(source: Path, target: str) -> str | None:
    """Why ``target`` (a link or citation written in ``source``) leads nowhere, or None."""
    path_part, _, anchor = target.partition("#")
    if not path_part:
        resolved = source
    elif source.suffix == ".md":
        resolved = (source.parent / path_part).resolve()
    else:
        resolved = (ROOT / path_part).resolve()
    if not resolved.is_relative_to(ROOT):
        return "points outside the repository"
    if not resolved.exists():
        return "names no file of the repository"
    if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
        return f"names no heading of {resolved.relative_to(ROOT)}"
    return None


def test_every_markdown_link_leads_to_a_file_and_heading_of_the_repository():
    dead = []
    for source in tracked_text_files():
        if source.suffix != ".md":
            continue
        for target in MARKDOWN_LINK.findall(source.read_text()):
            if not target.startswith(EXTERNAL) and (problem := _problem(source, target)):
                dead.append(f"{source.relative_to(ROOT)}: {target} {problem}")
    assert not dead, "\n".join(dead)


def test_every_docs_citation_in_the_code_leads_to_a_section_that_exists():
    dead, cited = [], 0
    for source in tracked_text_files():
        if source.suffix == ".md":
            continue
        for path_part, anchor in CITATION.findall(source.read_text()):
            cited += 1
            if problem := _problem(source, path_part + anchor):
                dead.append(f"{source.relative_to(ROOT)}: {path_part}{anchor} {problem}")
    assert not dead, "\n".join(dead)
    assert cited, "no citation found: the pattern no longer matches how the code cites docs/"


def test_nothing_cites_the_internal_specification():
    citing = [
        f"{source.relative_to(ROOT)}:{number}"
        for source in tracked_text_files()
        for number, line in enumerate(source.read_text().splitlines(), 1)
        if INTERNAL_SPEC in line or SHARED_DOCS in line
    ]
    assert not citing, f"cite the docs/ section that holds it instead: {citing}"
