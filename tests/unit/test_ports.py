"""The claim path's ports (workers/claim/ports.py) and who implements them.

mypy (`make lint`) checks each implementation's methods against its port:
their parameters' types and number, their return types. It compares
positional parameters by position alone, so this checks their names: a
stand-in whose parameters are named as its store's can be called as the
store is, keywords included.
"""

import inspect
from typing import Generic, Protocol

import pytest

from tests.support.in_memory import InMemoryClaims, InMemoryCompletions, RecordingFailures
from webhook_ingest.workers.claim.completions import CompletionStore
from webhook_ingest.workers.claim.idempotency import IdempotencyStore
from webhook_ingest.workers.claim.ports import FailurePolicyPort, IdempotencyStorePort, WorkerCompletionsPort
from webhook_ingest.workers.claim.retry import FailurePolicy

IMPLEMENTATIONS = [
    (WorkerCompletionsPort, CompletionStore),
    (WorkerCompletionsPort, InMemoryCompletions),
    (IdempotencyStorePort, IdempotencyStore),
    (IdempotencyStorePort, InMemoryClaims),
    (FailurePolicyPort, FailurePolicy),
    (FailurePolicyPort, RecordingFailures),
]


def methods(port: type) -> set[str]:
    """The port's methods, its base ports' included (not its attributes)."""
    return {
        name
        for cls in port.__mro__
        if cls not in (Protocol, Generic, object)
        for name, member in vars(cls).items()
        if inspect.isfunction(member) and not name.startswith("_")
    }


@pytest.mark.parametrize(
    ("port", "implementation"), IMPLEMENTATIONS, ids=[f"{p.__name__}-{i.__name__}" for p, i in IMPLEMENTATIONS]
)
def test_parameters_are_named_as_the_ports(port: type, implementation: type) -> None:
    for name in sorted(methods(port)):
        expected = inspect.signature(getattr(port, name)).parameters
        got = inspect.signature(getattr(implementation, name)).parameters
        assert list(got)[: len(expected)] == list(expected), f"{implementation.__name__}.{name}"
        extra = list(got.values())[len(expected) :]
        assert all(p.default is not p.empty for p in extra), f"{implementation.__name__}.{name}: a required extra"


def test_every_port_has_its_methods() -> None:
    assert "take_leases" in methods(WorkerCompletionsPort)  # from CompletionStorePort, its base
    assert "settled_before" in methods(WorkerCompletionsPort)
    assert "redlock" not in methods(IdempotencyStorePort)  # an attribute: mypy checks it
