"""A worker's connection budget and its split over the four pools
(workers/connection_budget.py), and the settings that choose it."""

import pytest

from webhook_ingest.shared.errors import ConfigError
from webhook_ingest.shared.settings import load_settings
from webhook_ingest.workers.connection_budget import PoolSizes, split


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
