"""The package's seams, as imports: `shared/` is a leaf, and the ingress and
the workers know each other only through it (CONTRIBUTING.md); inside
`shared/`, its packages and flat modules form a stated order of layers
(`LAYERS`, also the map in shared/__init__.py), each importing only its own
layer and those below, with no cycle between them."""

import ast
import graphlib
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
        {"audit", "runs", "ratelimit", "incidents", "worker_heartbeats"},
        "small stores over those: who acted, paced runs and their locks, limits, incidents, heartbeats",
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


def imported_modules(path: Path) -> set[str]:
    """The `webhook_ingest…` names a module imports, at its top or inside a
    function, relative imports resolved; `from webhook_ingest.shared import
    upkeep` names both `webhook_ingest.shared` and `webhook_ingest.shared.upkeep`."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or node.level):
            base = package_of(path)[: len(package_of(path)) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
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
