"""The repository carries its own contract: docs/reference.md's generated
tables match the code, every "§N" and every link between files resolves
inside the repository, nothing points outside it, and the README's layout
table and test folders match the tree. Static, no services."""

import os
import re
from pathlib import Path

import click
import pytest

from tests.support import reference_docs
from tests.support.markdown import anchor, heading_anchors, headings
from tests.support.repository import ROOT, repository_files
from webhook_ingest.shared.settings import ENVIRONMENT_VARIABLES, Settings

REFERENCE = ROOT / "docs" / "reference.md"
TEXT_SUFFIXES = (
    ".md",
    ".py",
    ".toml",
    ".yml",
    ".yaml",
    ".cfg",
    ".ini",
    ".txt",
    ".sh",
    ".json",
    ".sql",
    ".lua",
    ".html",
    ".css",
    ".js",
)
TEXT_NAMES = ("Makefile", "Dockerfile", "run")
SECTION_REFERENCE = re.compile(r"§\s*(\d+(?:\.\d+)?)")
OUTSIDE_CONTRACT = re.compile(r"\bSPEC(?:\.md|\s*§)")
PARENT_PATH = re.compile(r"(?:\.\./)+[A-Za-z0-9_.\-/]*")
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")
DOC_ANCHOR = re.compile(r"(?<![\w/.])(docs/[\w.\-]+\.md)#([\w\-]+)")


def text_files() -> list[Path]:
    """Our own text files: vendored minified code (htmx) is not ours to check."""
    return [
        path
        for path in repository_files()
        if (path.suffix in TEXT_SUFFIXES or path.name in TEXT_NAMES) and ".min." not in path.name
    ]


def lines_of(path: Path) -> list[tuple[int, str]]:
    return list(enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1))


def where(path: Path, number: int) -> str:
    return f"{path.relative_to(ROOT)}:{number}"


# -- generated tables -------------------------------------------------------------------------------


def test_the_generated_tables_match_the_code():
    text = REFERENCE.read_text()
    assert reference_docs.rewrite(text) == text, "docs/reference.md is stale: run `make docs` and commit it"


def test_every_setting_is_an_environment_variable_with_a_meaning():
    aliases = [field.alias for field in Settings.model_fields.values()]
    documented = [name for name, _ in ENVIRONMENT_VARIABLES]
    assert sorted(aliases) == sorted(documented), "Settings fields and ENVIRONMENT_VARIABLES differ"


@pytest.mark.parametrize(("path", "command"), reference_docs.commands(), ids=lambda value: str(value))
def test_every_command_and_option_says_what_it_does(path: str, command: click.Command):
    assert command.help, f"{path}: no docstring"
    undocumented = [p.name for p in command.params if isinstance(p, click.Option) and not p.hidden and not p.help]
    assert not undocumented, f"{path}: options without help=: {undocumented}"


def test_the_generated_blocks_hold_every_command_and_option():
    text = REFERENCE.read_text()
    for path, command in reference_docs.commands():
        assert f"`{path}" in text, path
        for parameter in command.params:
            if isinstance(parameter, click.Option) and not parameter.hidden:
                assert f"| `{path}` | `{', '.join(parameter.opts)}` |" in text, (path, parameter.opts)


# -- references resolve inside the repository -----------------------------------------------------


def numbered_sections(markdown: str) -> set[str]:
    return {match[1] for heading in headings(markdown) if (match := re.match(r"(\d+(?:\.\d+)*)\.?\s", heading))}


def test_section_rule():
    assert numbered_sections("## 6. Ingress\n### 8.1 Console\n## Design\n```\n## 9. not\n```\n") == {"6", "8.1"}
    assert SECTION_REFERENCE.findall("docs/reference.md §6–§8, §8.1.") == ["6", "8", "8.1"]
    spec = "SPEC"  # not written together here, or this very file would be reported
    assert OUTSIDE_CONTRACT.search(f"as {spec} §6 says") and OUTSIDE_CONTRACT.search(f"see {spec}.md")
    assert not OUTSIDE_CONTRACT.search("SPEC_VARIABLES = {")


def test_every_section_reference_names_a_section_of_the_reference():
    sections = numbered_sections(REFERENCE.read_text())
    assert {str(n) for n in range(1, 11)} <= sections
    dangling = [
        f"{where(path, number)}: §{section}"
        for path in text_files()
        for number, line in lines_of(path)
        for section in SECTION_REFERENCE.findall(line)
        if section not in sections
    ]
    assert not dangling, dangling


def test_no_file_refers_to_the_contract_outside_the_repository():
    found = [
        f"{where(path, number)}: {line.strip()}"
        for path in text_files()
        for number, line in lines_of(path)
        if OUTSIDE_CONTRACT.search(line)
    ]
    assert not found, f"write docs/reference.md §N instead: {found}"


def test_no_file_points_outside_the_repository():
    """A relative path that, resolved from its file's folder, leaves the root."""
    root = os.path.realpath(ROOT)
    found = []
    for path in text_files():
        for number, line in lines_of(path):
            for reference in PARENT_PATH.findall(line):
                target = os.path.realpath(os.path.join(path.parent, reference))
                if target != root and not target.startswith(root + os.sep):
                    found.append(f"{where(path, number)}: {reference}")
    assert not found, found


def test_markdown_links_resolve():
    broken = []
    for path in (p for p in repository_files() if p.suffix == ".md"):
        for number, line in lines_of(path):
            for target in MARKDOWN_LINK.findall(line):
                if re.match(r"[a-z]+:", target):
                    continue  # https:, mailto:
                problem = link_problem(path, target)
                if problem:
                    broken.append(f"{where(path, number)}: {target}: {problem}")
    assert not broken, broken


def test_doc_anchors_named_in_any_file_exist():
    broken = [
        f"{where(path, number)}: {doc}#{name}"
        for path in text_files()
        for number, line in lines_of(path)
        for doc, name in DOC_ANCHOR.findall(line)
        if link_problem(ROOT / "x", f"{doc}#{name}")
    ]
    assert not broken, broken


def link_problem(source: Path, target: str) -> str | None:
    file_part, _, fragment = target.partition("#")
    linked = (source.parent / file_part).resolve() if file_part else source
    if not linked.exists():
        return "no such file"
    if fragment and linked.suffix == ".md" and fragment not in heading_anchors(linked.read_text()):
        return "no such heading"
    return None


# -- the README and CONTRIBUTING match the tree ---------------------------------------------------


def layout_rows() -> list[str]:
    return [folder for folder, _ in layout_rows_with_text()]


def test_the_layout_table_names_what_exists():
    named = [name for cell in layout_rows() for name in re.findall(r"`([^`]+)`", cell)]
    missing = [name for name in named if not (ROOT / name).exists()]
    assert named and not missing, missing


def test_the_layout_table_names_every_top_level_folder():
    folders = {path.relative_to(ROOT).parts[0] for path in repository_files() if len(path.relative_to(ROOT).parts) > 1}
    named = {name.rstrip("/") for cell in layout_rows() for name in re.findall(r"`([^`]+)`", cell)}
    assert {folder for folder in folders if not folder.startswith(".")} <= named


@pytest.mark.parametrize("guide", ["README.md", "CONTRIBUTING.md"])
def test_the_guides_list_every_test_folder(guide: str):
    text = (ROOT / guide).read_text()
    folders = sorted(path.name for path in (ROOT / "tests").iterdir() if path.is_dir() and any(path.glob("*.py")))
    assert folders and not [folder for folder in folders if f"{folder}/" not in text]


def test_the_reference_headings_have_the_anchors_the_contents_list_uses():
    text = REFERENCE.read_text()
    assert anchor("## 6. Ingress HTTP contract".lstrip("# ")) == "6-ingress-http-contract"
    assert "6-ingress-http-contract" in heading_anchors(text)


def test_the_sources_table_has_every_field_of_the_model():
    from webhook_ingest.shared.sources.model import SourceSection

    section = REFERENCE.read_text().split("### Sources file", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `(\w+)` \|", section, flags=re.MULTILINE))
    assert documented == set(SourceSection.model_fields), (
        "docs/reference.md §3's sources table and SourceSection differ"
    )


def test_the_files_the_layout_table_names_exist():
    """A row's `x.py`, `x.md` and `x/` are somewhere under that row's folders."""
    missing = []
    for row in layout_rows_with_text():
        folders = [ROOT / name for name in re.findall(r"`([^`]+/)`", row[0])] or [ROOT]
        for name in re.findall(r"`([\w.]+(?:\.py|\.md|/))`", row[1]):
            if not any((folder / name).exists() or any(folder.rglob(name.rstrip("/"))) for folder in folders):
                missing.append(f"{row[0].strip()}: {name}")
    assert not missing, missing


def layout_rows_with_text() -> list[tuple[str, str]]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    return [(row.split("|")[1], row.split("|")[2]) for row in section.splitlines() if row.startswith("| `")]
