"""Citations of docs/design.md resolve: every `design.md, "NAME"` in the
repository (code, SQL, tests, docs) names a `##` or `###` heading of
docs/design.md, written exactly, and the `###` headings a citation may name
are unique. Links into it by anchor (`design.md#…`) are checked with every
other link by tests/deploy/test_reference.py. Static, no services."""

import re
from collections import Counter
from pathlib import Path

from tests.support.markdown import headings
from tests.support.repository import ROOT, repository_files

DESIGN = ROOT / "docs" / "design.md"
SUFFIXES = (".py", ".sql", ".md", ".toml", ".txt", ".html", ".lua", ".yml", ".yaml")
NAMES = ("Makefile",)
# A citation wraps over lines, inside comments: a line's indentation and its
# comment leader (`#`, `--`) become one space before the search.
_WRAP = re.compile(r"[ \t]*\n[ \t]*(?:--|#(?!#))?[ \t]*")
# `design.md, "NAME"`, `design.md "NAME"`, `design.md ("NAME"`, `design.md, \"NAME\"`
_CITATION = re.compile(r'design\.md,?\s*\(?\\?"([^"\\]+)\\?"')
# `design.md, Name` without quotes (a heading starts with a capital, prose
# going on after a comma does not): a citation the search above would miss
_UNQUOTED = re.compile(r"design\.md,\s*[A-Z][^\n]{0,40}")


def design_headings() -> list[str]:
    return [
        heading
        for line in DESIGN.read_text().splitlines()
        if line.startswith(("## ", "### "))
        for heading in headings(line)
    ]


def cited_texts() -> list[tuple[Path, str]]:
    """Each file that may cite design.md, its lines joined as `_WRAP` says."""
    found = []
    for path in repository_files():
        readable = path.suffix in SUFFIXES or path.name in NAMES
        if readable and path not in (DESIGN, Path(__file__)):
            found.append((path, _WRAP.sub(" ", path.read_text(errors="replace"))))
    return found


def citations() -> list[tuple[Path, str]]:
    return [(path, " ".join(name.split())) for path, text in cited_texts() for name in _CITATION.findall(text)]


def test_every_citation_names_a_heading_of_design_md():
    names = set(design_headings())
    broken = [f"{path.relative_to(ROOT)}: {name!r}" for path, name in citations() if name not in names]
    assert not broken, broken


def test_a_citation_quotes_its_name():
    unquoted = [
        f"{path.relative_to(ROOT)}: {match}" for path, text in cited_texts() for match in _UNQUOTED.findall(text)
    ]
    assert not unquoted, unquoted


def test_the_citations_are_found():
    """The search itself: the product cites design.md in dozens of places,
    across wrapped comments, and a search that found none would pass the test above."""
    cited = citations()
    assert len(cited) > 50
    assert any(path.suffix == ".sql" for path, _ in cited)


def test_a_heading_a_citation_may_name_is_unique():
    repeated = [heading for heading, count in Counter(design_headings()).items() if count > 1]
    assert not repeated, repeated


def test_every_section_names_a_package():
    """design.md's `##` sections are `PATH: concept`, PATH a package of the
    repository or a module of it (without `.py`): one section per package."""
    sections = [line[3:] for line in DESIGN.read_text().splitlines() if line.startswith("## ")]
    assert len(sections) > 10
    paths = [ROOT / section.partition(":")[0] for section in sections]
    missing = [str(path) for path in paths if not path.is_dir() and not path.with_suffix(".py").is_file()]
    assert not missing, missing
