"""Named SQL: every queries.sql of the product (and shared/worker_heartbeats.sql)
parses, no name is defined in two of them, every query the product code asks
for exists in the file it loads, and every query a file defines is asked for
somewhere (no dead SQL); every fragment a statement refers to is defined, in
its file or one it names in `fragments_from` (of its own layer or a lower
one), and every fragment defined is used."""

import re
from pathlib import Path

import pytest

from tests.support.repository import ROOT
from tests.unit.test_seams import LAYER
from webhook_ingest.shared.db.queries import REFERENCE, Fragment, load_queries, parse_blocks, parse_queries

PRODUCT = ("ingress", "workers", "shared", "webhook_ingest")
# `X = load_queries("webhook_ingest.shared.archive")`, or with a file name: `(..., "worker_heartbeats.sql")`,
# or with another package's fragments: `(..., fragments_from=["webhook_ingest.shared.archive"])`
_ARGS = r'load_queries\("webhook_ingest\.([\w.]+)"(?:, "([\w.]+)")?(?:, fragments_from=\[[^\]]*\])?\)'
_LOADED = re.compile(rf"^(\w+) = {_ARGS}", re.MULTILINE)
_CALL = re.compile(r'load_queries\("(webhook_ingest\.[\w.]+)"(?:, "([\w.]+)")?(?:, fragments_from=\[([^\]]*)\])?\)')
_LOADED_ONE = re.compile(rf'{_ARGS}\["(\w+)"\]')
_IMPORTED = re.compile(r"^from webhook_ingest\.([\w.]+) import ([^\n(]+|\([^)]*\))", re.MULTILINE)
_IMPORTED_RELATIVE = re.compile(r"^\s*from (\.+)([\w.]*) import ([^\n(]+|\([^)]*\))", re.MULTILINE)


def sql_file(package: str, filename: str = "") -> str:
    """The file `load_queries(package, filename)` reads, from the repository's root."""
    return "/".join([*package.split("."), filename or "queries.sql"])


def sql_files() -> dict[str, tuple[str, str]]:
    """{file: (package, filename)} for every file of named blocks in the product."""
    paths = [path for folder in PRODUCT for path in (ROOT / folder).rglob("*.sql") if "migrations" not in path.parts]
    files = {}
    for path in sorted(paths):
        relative = path.relative_to(ROOT)
        package = ".".join(["webhook_ingest", *relative.parent.parts])
        files[relative.as_posix()] = (package, "" if path.name == "queries.sql" else path.name)
    return files


def fragment_sources() -> dict[str, list[str]]:
    """{file: the packages whose fragments it may use} from every `load_queries(...)` of the product."""
    sources: dict[str, list[str]] = {}
    for path in product_files():
        for package, filename, others in _CALL.findall(path.read_text()):
            sources[sql_file(package.removeprefix("webhook_ingest."), filename)] = re.findall(r'"([\w.]+)"', others)
    return sources


def _load(file: str) -> dict[str, str]:
    package, filename = sql_files()[file]
    fragments_from = fragment_sources().get(file, [])
    if filename:
        return load_queries(package, filename, fragments_from=fragments_from)
    return load_queries(package, fragments_from=fragments_from)


def product_files() -> list[Path]:
    return sorted(path for folder in PRODUCT for path in (ROOT / folder).rglob("*.py"))


def _loaded_in(module: str) -> dict[str, str]:
    """{variable: file} for the `X = load_queries(...)` of a product module
    (`shared.dead_letters.model` is shared/dead_letters/model.py, `dlq` webhook_ingest/cli/dlq.py)."""
    parts = module.split(".")
    folder = ROOT if parts[0] in ("ingress", "workers", "shared") else ROOT / "webhook_ingest"
    path = folder.joinpath(*parts).with_suffix(".py")
    return _loaded(path.read_text()) if path.exists() else {}


def _loaded(text: str) -> dict[str, str]:
    return {variable: sql_file(package, filename) for variable, package, filename in _LOADED.findall(text)}


def _relative_imports(path: Path, text: str) -> list[tuple[str, str]]:
    """(module, names) of the file's relative imports, the module named as `_loaded_in` takes it."""
    package = list(path.relative_to(ROOT).parent.parts)
    if package[:1] == ["webhook_ingest"]:
        package = package[1:]
    found = []
    for dots, module, names in _IMPORTED_RELATIVE.findall(text):
        base = package[: len(package) - len(dots) + 1]
        found.append((".".join([*base, *([module] if module else [])]), names))
    return found


def used_queries(path: Path) -> set[tuple[str, str]]:
    """(file, name) of every query this file asks for by a literal name."""
    text = path.read_text()
    variables = _loaded(text)
    for module, names in [*_IMPORTED.findall(text), *_relative_imports(path, text)]:
        imported = {name.strip() for name in names.strip("()").split(",")}
        variables |= {name: file for name, file in _loaded_in(module).items() if name in imported}
    used = {(sql_file(package, filename), name) for package, filename, name in _LOADED_ONE.findall(text)}
    for variable, file in variables.items():
        used |= {(file, name) for name in re.findall(rf'\b{variable}\["(\w+)"\]', text)}
    return used


def test_the_parser_keeps_each_named_block_and_refuses_a_name_twice():
    assert parse_queries("-- name: a\nSELECT 1;\n\n-- name: b\nSELECT 2;\n") == {"a": "SELECT 1;", "b": "SELECT 2;"}
    text = "-- name: a\n-- What a does.\nSELECT 1  -- one\nFROM t\n\n-- next section ---\n\n-- name: b\nSELECT 2\n"
    assert parse_queries(text) == {"a": "SELECT 1  -- one\nFROM t", "b": "SELECT 2"}  # descriptions are for readers
    with pytest.raises(ValueError, match="'a' is defined twice"):
        parse_queries("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n")


def test_a_fragment_is_expanded_where_it_is_named_as_the_line_is_indented():
    text = (
        "-- fragment: f\n-- What f keeps.\nWHERE a = $1\n  AND b = $2\n\n"
        "-- name: q\nSELECT 1 FROM t\n{{f}}\n\n-- name: r\nSELECT (SELECT 1 FROM t\n    {{f}}\n      AND c)\n"
    )
    assert parse_queries(text) == {
        "q": "SELECT 1 FROM t\nWHERE a = $1\n  AND b = $2",
        "r": "SELECT (SELECT 1 FROM t\n    WHERE a = $1\n      AND b = $2\n      AND c)",
    }  # a fragment is no statement of its own
    assert parse_queries("-- name: q\nSELECT 1\n{{g}}\n", {"g": Fragment("WHERE x")}) == {"q": "SELECT 1\nWHERE x"}
    with pytest.raises(ValueError, match="fragment 'g' is not defined"):
        parse_queries("-- name: q\nSELECT 1\n{{g}}\n")
    with pytest.raises(ValueError, match="not on a line of its own"):
        parse_queries("-- fragment: f\nWHERE a\n-- name: q\nSELECT 1 {{f}}\n")
    with pytest.raises(ValueError, match="'f' refers to another fragment"):
        parse_queries("-- fragment: g\nWHERE a\n-- fragment: f\n{{g}}\n-- name: q\nSELECT 1\n")
    with pytest.raises(ValueError, match="'f' is defined twice"):
        parse_queries("-- fragment: f\nWHERE a\n-- name: f\nSELECT 1\n")


def test_a_fragment_with_parameters_takes_each_reference_s_numbers_in_order():
    text = (
        "-- fragment: held(sources, routes)\nJOIN r ON r.s = ANY($sources) AND r.n = ANY($routes) AND x = $1\n\n"
        "-- name: q\nSELECT 1 FROM a\n{{held($14, $15)}}\n\n-- name: r\nSELECT 1 FROM a\n  {{held($10, $9)}}\n"
    )
    assert parse_queries(text) == {
        "q": "SELECT 1 FROM a\nJOIN r ON r.s = ANY($14) AND r.n = ANY($15) AND x = $1",
        "r": "SELECT 1 FROM a\n  JOIN r ON r.s = ANY($10) AND r.n = ANY($9) AND x = $1",
    }
    with pytest.raises(ValueError, match=r"'held' takes \(sources, routes\), given \(\$14\)"):
        parse_queries("-- fragment: held(sources, routes)\nAND $sources $routes\n-- name: q\nSELECT 1\n{{held($14)}}\n")
    with pytest.raises(ValueError, match="'held' takes"):
        parse_queries("-- fragment: held(sources)\nAND $sources\n-- name: q\nSELECT 1\n{{held(sources)}}\n")
    with pytest.raises(ValueError, match=r"declares \(sources\) but uses \['routes', 'sources'\]"):
        parse_queries("-- fragment: held(sources)\nAND $sources $routes\n")
    with pytest.raises(ValueError, match=r"declares \(sources, routes\) but uses \['sources'\]"):
        parse_queries("-- fragment: held(sources, routes)\nAND $sources\n")
    with pytest.raises(ValueError, match="only a fragment does"):
        parse_queries("-- name: q(a)\nSELECT $a\n")


def test_every_fragment_used_is_defined_within_reach_and_every_one_defined_is_used():
    files = sql_files()
    texts = {file: (ROOT / file).read_text() for file in files}
    defined = {(file, name) for file, text in texts.items() for name in parse_blocks(text)[1]}
    used = set()
    for file, text in texts.items():
        reach = [file] + [
            sql_file(package.removeprefix("webhook_ingest.")) for package in fragment_sources().get(file, [])
        ]
        for name in {match[1] for match in REFERENCE.findall(text)}:
            where = [other for other in reach if (other, name) in defined]
            assert where, f"{file} refers to fragment {name!r}, defined in none of {reach}"
            used.add((where[-1], name))
    assert sorted(defined - used) == [], "a fragment no statement refers to"
    assert ("shared/archive/queries.sql", "archive_filter") in used


def test_a_file_takes_fragments_only_from_its_own_layer_or_a_lower_one():
    def unit(file: str) -> str:
        parts = file.split("/")
        return parts[1].removesuffix(".sql") if parts[0] == "shared" else parts[0]

    for file, packages in fragment_sources().items():
        for package in packages:
            other = sql_file(package.removeprefix("webhook_ingest."))
            assert unit(file) in LAYER and unit(other) in LAYER, (file, other)
            assert LAYER[unit(other)] <= LAYER[unit(file)], f"{file} takes fragments of {other}, a higher layer"


def test_every_query_asked_for_exists_and_every_defined_one_is_used():
    used = set().union(*(used_queries(path) for path in product_files()))
    files = sql_files()
    defined = {(file, name) for file in files for name in _load(file)}
    assert sorted(used - defined) == [], "asked for, not in the file its module loads"
    assert sorted(defined - used) == [], "in a queries.sql, never asked for"
    assert {file for file, _ in used} == set(files)  # the scan found each file's queries


def test_every_file_parses_and_no_name_is_defined_in_two_files():
    files = sql_files()
    assert {"shared/archive/queries.sql", "shared/dead_letters/queries.sql", "workers/queries.sql"} <= set(files)
    seen: dict[str, str] = {}
    for file in files:
        queries = _load(file)
        assert queries, f"{file} defines no named statement"
        assert all(queries.values()), f"{file} has a name with no statement"
        twice = {name: seen[name] for name in queries if name in seen}
        assert twice == {}, f"{file} defines names another file does"
        seen |= dict.fromkeys(queries, file)
