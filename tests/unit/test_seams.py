"""The package's seams, as imports: `shared/` is a leaf, and the ingress and
the workers know each other only through it (CONTRIBUTING.md); inside
`shared/`, its packages and flat modules form a stated order of layers
(`LAYERS`, also the map in shared/__init__.py), each importing only its own
layer and those below, with no cycle between them."""

import ast
import functools
import graphlib
import importlib
import re
from pathlib import Path

import pytest

import webhook_ingest.shared
from tests.support.repository import ROOT

# folder -> the subpackages of webhook_ingest its modules may import
ALLOWED = {
    "shared": {"shared"},
    "ingress": {"ingress", "shared"},
    "workers": {"workers", "shared"},
}

# shared/'s packages and flat modules, lowest layer first: (names, why they sit there).
LAYERS: list[tuple[set[str], str]] = [
    (
        {"errors", "service_errors", "storable_text", "storable_json", "backoff", "redis_keys"},
        "plain values, errors and waits: they import nothing of shared/",
    ),
    ({"event", "settings"}, "what an event is and the process's settings: words the rest speaks"),
    (
        {"observability", "db", "broker", "signatures"},
        "clients of the services (logs, metrics, traces; Postgres; RabbitMQ) and signature checks",
    ),
    (
        {"audit", "runs", "ratelimit", "incidents", "worker_heartbeats", "ordering"},
        "small stores over those: who acted, paced runs and their locks, limits, incidents, heartbeats,"
        " ordering keys' rows",
    ),
    ({"sources"}, "the sources file: its settings (retention, routes, ignore rules) and its pauses, audited"),
    ({"archive"}, "the event archive: reads a source's routes, knows nothing of who replays or discards"),
    (
        {"dead_letters", "replays"},
        "acts on archived events: a dead letter's act writes its archived row, a replay is a selection",
    ),
    ({"upkeep"}, "the task every process runs over the archive and the replays: days, settling, pruning"),
]
LAYER = {name: index for index, (names, _) in enumerate(LAYERS) for name in names}
SHARED = ROOT / "shared"


# The package-dir mapping (pyproject.toml): each top-level folder's package.
FOLDERS = {
    "webhook_ingest": "webhook_ingest",
    "ingress": "webhook_ingest.ingress",
    "shared": "webhook_ingest.shared",
    "workers": "webhook_ingest.workers",
}


def package_of(path: Path) -> list[str]:
    """The dotted package a module's file is in, as parts."""
    folder, *rest = path.relative_to(ROOT).parts
    return [*FOLDERS[folder].split("."), *rest[:-1]]


def statement_names(path: Path, node: ast.stmt) -> tuple[str, set[str]] | None:
    """An import statement's module (relative imports resolved; "" for a plain
    `import`) and the names it imports from it, full; None for any other statement."""
    if isinstance(node, ast.ImportFrom) and (node.module or node.level):
        base = package_of(path)[: len(package_of(path)) - node.level + 1] if node.level else []
        module = ".".join([*base, *([node.module] if node.module else [])])
        return module, {f"{module}.{alias.name}" for alias in node.names}
    if isinstance(node, ast.Import):
        return "", {alias.name for alias in node.names}
    return None


def imported_modules(path: Path) -> set[str]:
    """The `webhook_ingest…` names a module imports, at its top or inside a
    function, relative imports resolved; `from webhook_ingest.shared import
    upkeep` names both `webhook_ingest.shared` and `webhook_ingest.shared.upkeep`."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.stmt) and (found := statement_names(path, node)):
            module, imported = found
            names.update({module, *imported} - {""})
    return {name for name in names if name.split(".")[0] == "webhook_ingest"}


def imported_subpackages(path: Path) -> set[str]:
    """The `webhook_ingest.X` a module imports, at its top or inside a function."""
    parts = [name.split(".") for name in imported_modules(path)]
    return {part[1] if len(part) > 1 else "webhook_ingest" for part in parts}


def shared_unit(path: Path) -> str:
    """The package or flat module of shared/ a file belongs to."""
    return path.relative_to(SHARED).parts[0].removesuffix(".py")


def shared_units() -> set[str]:
    return {shared_unit(path) for path in SHARED.rglob("*.py")} - {"__init__"}


def shared_imports() -> dict[tuple[str, str], set[str]]:
    """(from, to) between shared/'s units -> the files that import across."""
    edges: dict[tuple[str, str], set[str]] = {}
    units = shared_units()
    for path in sorted(SHARED.rglob("*.py")):
        source = shared_unit(path)
        for name in imported_modules(path):
            parts = name.split(".")
            if parts[:2] == ["webhook_ingest", "shared"] and len(parts) > 2 and parts[2] in units:
                if parts[2] != source:
                    edges.setdefault((source, parts[2]), set()).add(str(path.relative_to(ROOT)))
    return edges


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_each_folder_imports_only_what_its_layer_may(folder):
    crossings = {
        str(path.relative_to(ROOT)): sorted(imported - ALLOWED[folder])
        for path in sorted((ROOT / folder).rglob("*.py"))
        if (imported := imported_subpackages(path)) - ALLOWED[folder]
    }
    assert crossings == {}


def test_the_order_names_each_package_and_module_of_shared_once():
    named = [name for names, _ in LAYERS for name in names]
    assert sorted(named) == sorted(set(named)), "named in two layers"
    assert set(named) == shared_units()


def test_each_import_in_shared_goes_to_its_own_layer_or_a_lower_one():
    upward = {
        f"{source} ({LAYER[source]}) -> {target} ({LAYER[target]})": sorted(files)
        for (source, target), files in shared_imports().items()
        if LAYER[target] > LAYER[source]
    }
    assert upward == {}


def test_the_packages_of_shared_import_each_other_without_a_cycle():
    graph: dict[str, set[str]] = {unit: set() for unit in shared_units()}
    for source, target in shared_imports():
        graph[source].add(target)
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        pytest.fail(f"import cycle between shared/'s packages: {' -> '.join(error.args[1])}")


def test_the_map_of_shared_states_the_same_order():
    stated = re.findall(r"^(\d+)\. ([\w, ]+) — ", webhook_ingest.shared.__doc__ or "", re.MULTILINE)
    assert [(int(index), set(names.split(", "))) for index, names in stated] == [
        (index, names) for index, (names, _) in enumerate(LAYERS)
    ]


# -- cycles between modules ------------------------------------------------------


@functools.cache  # read for each import statement the rule looks at: a walk of the tree each time cost ~3 s of CPU
def module_files() -> dict[str, Path]:
    """Every module of the package, by its dotted name."""
    files = {}
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            parts = package_of(path)
            files[".".join(parts if path.name == "__init__.py" else [*parts, path.stem])] = path
    return files


def _is_type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def import_statements(body: list[ast.stmt], in_functions: bool) -> list[ast.stmt]:
    """The import statements that run when the module is imported: those of
    its body, and of the `if`/`try`/`with` blocks and class bodies there (not
    under `if TYPE_CHECKING:`, which never runs); with `in_functions`, those
    inside its functions too."""
    found: list[ast.stmt] = []
    for node in body:
        if _is_type_checking(node):
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not in_functions:
            continue
        blocks = [getattr(node, name, None) for name in ("body", "orelse", "finalbody")]
        blocks += [handler.body for handler in getattr(node, "handlers", None) or []]
        blocks += [case.body for case in getattr(node, "cases", None) or []]
        for block in blocks:
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                found += import_statements(block, in_functions)
    return found


def module_imports(in_functions: bool) -> dict[str, set[str]]:
    """module -> the package's modules it imports (`imported_modules`'s
    resolution): `from P import name` is an edge to the module P.name when
    there is one, to P when the name is not a module (an attribute of P)."""
    files = module_files()
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        edges = graph.setdefault(name, set())
        for node in import_statements(ast.parse(path.read_text()).body, in_functions):
            module, imported = statement_names(path, node) or ("", set())
            edges.update(imported & files.keys())
            if module in files and imported - files.keys():
                edges.add(module)
        edges.discard(name)
    return graph


def cycle_in(graph: dict[str, set[str]]) -> list[str] | None:
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        return list(error.args[1])
    return None


# Cycles allowed for now, as (importer, imported) edges, each with why: none.
# An entry here is a cycle still to cut (a module below both sides), never a way to add one.
KNOWN_CYCLE_EDGES: dict[tuple[str, str], str] = {}


def test_the_modules_import_each_other_at_their_top_without_a_cycle():
    """Imports at a module's top (its body, not its functions) form no cycle:
    what two modules both need lives in a module below both (e.g.
    ingress/admin/common.py, cli/event_filters.py, observability/loggers.py,
    workers/handlers/interface.py), never in one of them that the other imports."""
    graph = module_imports(in_functions=False)
    for source, target in KNOWN_CYCLE_EDGES:
        graph[source].discard(target)
    cycle = cycle_in(graph)
    assert cycle is None, f"import cycle between modules: {' -> '.join(cycle or [])}"


def test_no_import_inside_a_function_closes_a_cycle():
    """The imports kept inside functions are there for start-up time (the
    CLI's commands loaded on demand, OpenTelemetry, the console's libraries,
    the built-in handlers behind the light handler API), never to dodge a
    cycle: with them counted too, the modules still form none."""
    graph = module_imports(in_functions=True)
    for source, target in KNOWN_CYCLE_EDGES:
        graph[source].discard(target)
    cycle = cycle_in(graph)
    assert cycle is None, (
        f"import cycle between modules (counting imports inside functions): {' -> '.join(cycle or [])}"
    )


def test_the_cycle_check_sees_a_cycle():
    cycle = cycle_in({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    assert cycle is not None and cycle[0] == cycle[-1] and set(cycle) == {"a", "b", "c"}
    assert cycle_in({"a": {"b"}, "b": set()}) is None


# -- one import rule: relative inside a package, its public names from outside ---


@functools.cache
def concept_packages() -> frozenset[str]:
    """The packages one level below a top-level folder (shared/archive/,
    workers/claim/, ingress/intake/, webhook_ingest/cli/ …): each one concept,
    whose `__init__.py` maps its modules and lists in `__all__` what the rest
    of the code may use of it."""
    return frozenset(
        name
        for name, path in module_files().items()
        if path.name == "__init__.py" and len(path.relative_to(ROOT).parts) == 3
    )


@functools.cache
def public_names(path: Path) -> frozenset[str]:
    """A package's `__all__`, as its `__init__.py` states it."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            return frozenset(ast.literal_eval(node.value))
    return frozenset()


def _package_of(module: str, packages: frozenset[str]) -> str | None:
    return next((package for package in packages if module == package or module.startswith(f"{package}.")), None)


def _import_breaks(node: ast.Import, where: str, own: str | None, packages: frozenset[str]) -> list[str]:
    breaks = []
    for alias in node.names:
        package = _package_of(alias.name, packages)
        if package and package != own and alias.name != package:
            breaks.append(
                f"{where}{node.lineno}: `import {alias.name}` reaches into {package}: use `from {package} import NAME`"
            )
    return breaks


def _from_breaks(path: Path, node: ast.ImportFrom, where: str, own: str | None, packages: frozenset[str]) -> list[str]:
    files = module_files()
    module = (statement_names(path, node) or ("", set()))[0]
    breaks = []
    for alias in node.names:
        full = f"{module}.{alias.name}"
        target = full if full in files else module
        package = _package_of(target, packages)
        written = f"`from {'.' * node.level}{node.module or ''} import {alias.name}`"
        if package is None or full == package:
            continue  # not a package's, or the package itself (`from webhook_ingest.shared import signatures`)
        if package == own and path.name != "__init__.py":
            if node.level == 0 or target == module == own:
                breaks.append(
                    f"{where}{node.lineno}: {written} inside {own}: import from a module of your own package,"
                    f" relatively (`from .{target.split('.')[-1] if target != own else 'MODULE'} import …`)"
                )
        elif package != own and not (module == package and alias.name in public_names(files[package])):
            breaks.append(
                f"{where}{node.lineno}: {written} reaches into {package}: use `from {package} import"
                f" {alias.name}`, the name re-exported by {files[package].relative_to(ROOT)} and listed in its __all__"
            )
    return breaks


def rule_breaks(name: str, path: Path, source: str) -> list[str]:
    """Where a module's imports (at its top, in functions, under TYPE_CHECKING)
    break the rule: a package's modules import each other relatively, never
    through its own `__init__`; any other module imports a package's names
    from the package itself, and only those of its `__all__` (a relative
    import that climbs out of a package is a crossing too)."""
    packages = concept_packages()
    own = _package_of(name, packages)
    where = f"{path.relative_to(ROOT)}:"
    breaks = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            breaks += _import_breaks(node, where, own, packages)
        elif isinstance(node, ast.ImportFrom):
            breaks += _from_breaks(path, node, where, own, packages)
    return breaks


def test_a_package_is_entered_only_through_its_public_names():
    """The import rule of CONTRIBUTING.md: the structure of the code is then
    the graph of its imports, package to package."""
    breaks = [
        line for name, path in sorted(module_files().items()) for line in rule_breaks(name, path, path.read_text())
    ]
    assert not breaks, f"{len(breaks)} imports break the import rule:\n" + "\n".join(breaks)


@pytest.mark.parametrize("package", sorted(concept_packages()))
def test_each_public_name_is_there(package):
    """A name of `__all__` is bound by the `__init__`, or is a module of the
    package (a namespace such as `metrics`), which `from P import m` loads on
    demand: the `__init__` does not import it, so its cost falls only on the
    processes that use it."""
    module = importlib.import_module(package)
    missing = {name for name in public_names(module_files()[package]) if not hasattr(module, name)}
    assert (
        sorted(
            missing
            - module_files().keys()
            - {name.rpartition(".")[2] for name in module_files() if name.startswith(f"{package}.")}
        )
        == []
    )


def test_the_import_rule_sees_a_crossing():
    app = ROOT / "ingress" / "app.py"
    source = (
        "from webhook_ingest.shared.archive.store import ArchiveStore\n"
        "from ..shared.archive.search import Cursor\n"
        "from webhook_ingest.shared.signatures import SignatureError\n"
        "def f():\n    import webhook_ingest.workers.claim.processor\n"
    )
    breaks = rule_breaks("webhook_ingest.ingress.app", app, source)
    assert [line.split(": ")[0] for line in breaks] == ["ingress/app.py:1", "ingress/app.py:2", "ingress/app.py:5"]
    assert "use `from webhook_ingest.shared.archive import ArchiveStore`" in breaks[0]
    inner = ROOT / "shared" / "archive" / "store.py"
    assert rule_breaks("webhook_ingest.shared.archive.store", inner, "from webhook_ingest.shared.archive import X\n")
    assert not rule_breaks("webhook_ingest.shared.archive.store", inner, "from .model import X\n")
