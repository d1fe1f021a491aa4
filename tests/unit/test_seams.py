"""The package's seams, as imports: `shared/` is a leaf, and the ingress and
the workers know each other only through it (CONTRIBUTING.md)."""

import ast
from pathlib import Path

import pytest

from tests.support.repository import ROOT

# folder -> the subpackages of webhook_ingest its modules may import
ALLOWED = {
    "shared": {"shared"},
    "ingress": {"ingress", "shared"},
    "workers": {"workers", "shared"},
}


def imported_subpackages(path: Path) -> set[str]:
    """The `webhook_ingest.X` a module imports, at its top or inside a function."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    parts = [name.split(".") for name in names if name.split(".")[0] == "webhook_ingest"]
    return {part[1] if len(part) > 1 else "webhook_ingest" for part in parts}


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_each_folder_imports_only_what_its_layer_may(folder):
    crossings = {
        str(path.relative_to(ROOT)): sorted(imported - ALLOWED[folder])
        for path in sorted((ROOT / folder).rglob("*.py"))
        if (imported := imported_subpackages(path)) - ALLOWED[folder]
    }
    assert crossings == {}
