"""Named SQL: every query the product code asks for exists, and every query a
queries.sql defines is asked for somewhere (no dead SQL)."""

import re
from pathlib import Path

import pytest

from tests.support.repository import ROOT
from webhook_ingest.shared.db.queries import load_queries, parse_queries

PACKAGES = {"ingress": "webhook_ingest.ingress", "workers": "webhook_ingest.workers", "shared": "webhook_ingest.shared"}
PRODUCT = ("ingress", "workers", "shared", "webhook_ingest")
_LOADED = re.compile(r'^(\w+) = load_queries\("webhook_ingest\.(\w+)"\)', re.MULTILINE)
_LOADED_ONE = re.compile(r'load_queries\("webhook_ingest\.(\w+)"\)\["(\w+)"\]')
_IMPORTED = re.compile(r"^from webhook_ingest\.([\w.]+) import ([^\n(]+|\([^)]*\))", re.MULTILINE)


def product_files() -> list[Path]:
    return sorted(path for folder in PRODUCT for path in (ROOT / folder).rglob("*.py"))


def _loaded_in(module: str) -> dict[str, str]:
    """{variable: package} for the `X = load_queries(...)` of a product module
    (`shared.dead_letters.model` is shared/dead_letters/model.py, `dlq` webhook_ingest/cli/dlq.py)."""
    parts = module.split(".")
    folder = ROOT if parts[0] in PACKAGES else ROOT / "webhook_ingest"
    path = folder.joinpath(*parts).with_suffix(".py")
    return dict(_LOADED.findall(path.read_text())) if path.exists() else {}


def used_queries(path: Path) -> set[tuple[str, str]]:
    """(package, name) of every query this file asks for by a literal name."""
    text = path.read_text()
    variables = dict(_LOADED.findall(text))
    for module, names in _IMPORTED.findall(text):
        imported = {name.strip() for name in names.strip("()").split(",")}
        variables |= {name: package for name, package in _loaded_in(module).items() if name in imported}
    used = set(_LOADED_ONE.findall(text))
    for variable, package in variables.items():
        used |= {(package, name) for name in re.findall(rf'\b{variable}\["(\w+)"\]', text)}
    return used


def test_the_parser_keeps_each_named_block_and_refuses_a_name_twice():
    assert parse_queries("-- name: a\nSELECT 1;\n\n-- name: b\nSELECT 2;\n") == {"a": "SELECT 1;", "b": "SELECT 2;"}
    text = "-- name: a\n-- What a does.\nSELECT 1  -- one\nFROM t\n\n-- next section ---\n\n-- name: b\nSELECT 2\n"
    assert parse_queries(text) == {"a": "SELECT 1  -- one\nFROM t", "b": "SELECT 2"}  # descriptions are for readers
    with pytest.raises(ValueError, match="'a' is defined twice"):
        parse_queries("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n")


def test_every_query_asked_for_exists_and_every_defined_one_is_used():
    used = set().union(*(used_queries(path) for path in product_files()))
    defined = {(folder, name) for folder, package in PACKAGES.items() for name in load_queries(package)}
    assert sorted(used - defined) == [], "asked for, not in queries.sql"
    assert sorted(defined - used) == [], "in queries.sql, never asked for"
    assert {package for package, _ in used} == set(PACKAGES)  # the scan found each file's queries
