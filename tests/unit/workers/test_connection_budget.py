"""A worker's connection budget and its split over the four pools
(workers/connection_budget.py), and the settings that choose it.

The shipped Kubernetes manifests against the connection budget (issue 35,
requirement 4): docs/operations.md says 10 workers and 2 ingress *processes*
fit a stock Postgres, but deploy/kubernetes/ingress.yaml runs 2 ingress
*pods* of `--processes auto` under a CPU limit of 2, so 4 ingress processes.
A rollout counts too: the pods a rolling update adds, and the old ones still
terminating, hold their sessions beside the others."""

import pytest
import yaml

from tests.support.repository import ROOT
from webhook_ingest.shared.errors import ConfigError
from webhook_ingest.shared.settings import INGRESS_CONNECTIONS, WORKER_CONNECTIONS, load_settings
from webhook_ingest.workers.connection_budget import PoolSizes, split

DEPLOY = ROOT / "deploy" / "kubernetes"
STOCK_FOR_THE_APP = 100 - 3  # max_connections, less the superusers' reserve
WORKER_PODS = 10  # within worker-scaling.yaml's 2..20, the figure operations.md promises


def _deployment(name: str) -> dict:
    return next(doc for doc in yaml.safe_load_all((DEPLOY / name).read_text()) if doc["kind"] == "Deployment")


def _ingress_processes_per_pod(deployment: dict) -> int:
    """`--processes auto`: one per core of the container's CPU limit, at most 4 (webhook_ingest/cli/layout.py)."""
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    requested = args[args.index("--processes") + 1] if "--processes" in args else "1"
    if requested != "auto":
        return int(requested)
    limit = float(str(container["resources"]["limits"]["cpu"]).rstrip("m")) / (
        1000 if str(container["resources"]["limits"]["cpu"]).endswith("m") else 1
    )
    return max(1, min(int(-(-limit // 1)), 4))


def _connections_per_process(deployment: dict, setting: str, default: int) -> int:
    env = deployment["spec"]["template"]["spec"]["containers"][0].get("env", [])
    return int(next((entry["value"] for entry in env if entry["name"] == setting), default))


def _percent_or_count(value: int | str, replicas: int, round_up: bool) -> int:
    if isinstance(value, int):
        return value
    share = replicas * int(value.rstrip("%")) / 100
    return int(-(-share // 1)) if round_up else int(share)


def _pods_during_a_rollout(deployment: dict, replicas: int) -> int:
    """The most pods that hold sessions at once while the Deployment rolls:
    Recreate ends the old ones first; a rolling update adds maxSurge and keeps
    those it scaled down terminating — one step's worth (maxSurge +
    maxUnavailable) when minReadySeconds outlasts a pod's termination, else
    possibly every old one."""
    strategy = deployment["spec"].get("strategy", {"type": "RollingUpdate"})
    if strategy["type"] == "Recreate":
        return replicas
    rolling = strategy.get("rollingUpdate", {})
    surge = _percent_or_count(rolling.get("maxSurge", "25%"), replicas, round_up=True)
    unavailable = _percent_or_count(rolling.get("maxUnavailable", "25%"), replicas, round_up=False)
    spec = deployment["spec"]["template"]["spec"]
    if deployment["spec"].get("minReadySeconds", 0) >= spec.get("terminationGracePeriodSeconds", 30):
        return replicas + surge + surge + unavailable
    return replicas + surge + replicas


def _ingress_connections(pods: int) -> int:
    ingress = _deployment("ingress.yaml")
    return (
        pods
        * _ingress_processes_per_pod(ingress)
        * _connections_per_process(ingress, "WEBHOOK_INGEST_INGRESS_CONNECTIONS", INGRESS_CONNECTIONS)
    )


def _worker_connections(pods: int) -> int:
    return pods * _connections_per_process(
        _deployment("worker.yaml"), "WEBHOOK_INGEST_WORKER_CONNECTIONS", WORKER_CONNECTIONS
    )


def test_ten_worker_pods_and_the_shipped_ingress_fit_a_stock_postgres():
    ingress = _deployment("ingress.yaml")
    needed = _worker_connections(WORKER_PODS) + _ingress_connections(ingress["spec"]["replicas"])
    assert needed <= STOCK_FOR_THE_APP


def test_ten_worker_pods_and_the_shipped_ingress_fit_while_both_roll():
    """`kubectl apply -k` after a new image rolls both Deployments at once."""
    ingress = _deployment("ingress.yaml")
    needed = _worker_connections(
        _pods_during_a_rollout(_deployment("worker.yaml"), WORKER_PODS)
    ) + _ingress_connections(_pods_during_a_rollout(ingress, ingress["spec"]["replicas"]))
    assert needed <= STOCK_FOR_THE_APP


@pytest.mark.parametrize("budget", range(5, 80))
def test_the_pools_together_keep_to_the_budget(budget):
    sizes = split(budget, concurrency=256)
    assert sizes.total == budget
    assert min(sizes) >= 1 and sizes.statements >= 2


def test_a_bigger_budget_never_has_fewer_transaction_connections():
    transactions = [split(budget, 256).transactions for budget in range(5, 80)]
    assert transactions == sorted(transactions)


def test_the_default_and_the_sizes_before_the_budget():
    assert split(8, 256) == PoolSizes(statements=2, transactions=4, renewals=1, bookkeeping=1)
    assert split(28, 256) == PoolSizes(statements=4, transactions=20, renewals=2, bookkeeping=2)


def test_no_more_transaction_connections_than_messages_in_flight():
    assert split(28, concurrency=4).transactions == 4


@pytest.mark.parametrize(
    "variable, value, said",
    [
        ("WEBHOOK_INGEST_WORKER_CONNECTIONS", "4", "a worker needs at least 5"),
        ("WEBHOOK_INGEST_INGRESS_CONNECTIONS", "2", "an ingress process needs at least 3"),
        ("WEBHOOK_INGEST_WORKER_CONNECTIONS", "many", "valid integer"),
    ],
)
def test_a_budget_too_small_is_refused_with_its_reason(monkeypatch, variable, value, said):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=f"{variable}: .*{said}"):
        load_settings()


def test_the_defaults_fit_ten_workers_and_two_ingress_on_a_stock_postgres():
    settings = load_settings()
    assert 10 * settings.worker_connections + 2 * settings.ingress_connections <= 100 - 3 - 5
