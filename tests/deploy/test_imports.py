"""Every module of the package imports on its own, first (as aiohttp's
tests do): an import cycle that the usual import order hides — module A
importing B, whose top imports A back — fails here for whichever of the two
is imported first, as it would for a user's script or a tool that imports
that one module.

One interpreter loads the third-party libraries every module may use, then
forks a child per module that imports it alone: the product's modules are
never loaded before the one under test, and nobody pays for aiohttp and
asyncpg 150 times (nor for pydantic and cryptography 120 times: a child
cost ~94 ms of CPU with them left out, ~48 ms with them in)."""

import json
import subprocess
import sys

from tests.support.repository import ROOT

# Run in a fresh interpreter: {module: its error} for the modules that fail to import alone.
PROBE = r"""
import importlib, json, os, pkgutil, sys

THIRD_PARTY = ("aiohttp", "aiohttp.web", "aio_pika", "aiormq", "asyncpg", "redis.asyncio", "structlog", "click",
               "orjson", "multidict", "yarl", "jinja2", "prometheus_client", "pydantic", "pydantic_settings",
               "cryptography.hazmat.primitives.asymmetric.ed25519", "tomllib", "aiohttp_jinja2", "aiohttp_session")
for name in THIRD_PARTY:
    try:
        importlib.import_module(name)
    except ImportError:
        pass

names = json.loads(sys.stdin.read())
failed = {}
for name in names:
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read)
        try:
            importlib.import_module(name)
            error = ""
        except BaseException as exc:  # whatever it raised is the answer
            error = f"{type(exc).__name__}: {exc}"
        os.write(write, error.encode()[:4000])
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        error = answer.read().decode()
    os.waitpid(child, 0)
    if error:
        failed[name] = error
print(json.dumps({"modules": len(names), "failed": failed}))
"""

# Optional extras a module may need: it may fail to import without them.
OPTIONAL_EXTRAS = ("opentelemetry",)
# The package-dir mapping (pyproject.toml): the folder of each top-level part of the package.
FOLDERS = {
    "webhook_ingest": "webhook_ingest",
    "webhook_ingest.ingress": "ingress",
    "webhook_ingest.shared": "shared",
    "webhook_ingest.workers": "workers",
}


def modules() -> list[str]:
    """Every module of the package by its files (importing none: the probe must be the first to)."""
    names = set()
    for package, folder in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if parts and parts[-1] == "__main__":
                continue
            names.add(".".join((package, *parts)))
    return sorted(names)


def test_every_module_imports_alone():
    names = modules()
    done = subprocess.run(
        [sys.executable, "-c", PROBE], input=json.dumps(names), capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    probed = json.loads(done.stdout.strip().splitlines()[-1])
    assert probed["modules"] == len(names) > 100
    failed = {
        name: error
        for name, error in probed["failed"].items()
        if not (error.startswith("ModuleNotFoundError") and any(extra in error for extra in OPTIONAL_EXTRAS))
    }
    assert failed == {}
