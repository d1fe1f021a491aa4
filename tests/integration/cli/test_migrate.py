"""`webhook-ingest migrate` as an operator of a managed Postgres meets it:
the `postgres` maintenance database is forbidden, a setting has a typo."""

import asyncio
from urllib.parse import urlsplit

import asyncpg

from tests.integration.cli.test_main import webhook_ingest
from tests.support.pg_gatekeeper import PostgresGatekeeper
from webhook_ingest.cli.preflight import service_problems
from webhook_ingest.shared.settings import Settings


def name_of(database_url: str) -> str:
    return urlsplit(database_url).path.lstrip("/")


async def migrate_through(gatekeeper: PostgresGatekeeper, database: str, **env: str):
    return await asyncio.to_thread(
        webhook_ingest, "migrate", env={"DATABASE_URL": gatekeeper.url_for(database), "LOG_FORMAT": "json", **env}
    )


async def test_an_existing_database_is_migrated_without_the_maintenance_database(database):
    async with PostgresGatekeeper(refused={"postgres"}) as gatekeeper:
        result = await migrate_through(gatekeeper, name_of(database))
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    assert result.stdout.strip() == "database is up to date"
    assert "postgres" not in gatekeeper.asked_for


async def test_a_missing_database_we_may_not_create_is_one_clear_line(namespace):
    missing = f"wi_{namespace}_missing"
    async with PostgresGatekeeper(refused={"postgres"}) as gatekeeper:
        result = await migrate_through(gatekeeper, missing)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"error: database '{missing}' does not exist and cannot be created here:")
    assert "permission denied" in result.stderr and f'CREATE DATABASE "{missing}"' in result.stderr


async def test_a_missing_database_is_created_when_we_may(namespace):
    missing = f"wi_{namespace}_created"
    try:
        async with PostgresGatekeeper(refused=set()) as gatekeeper:
            result = await migrate_through(gatekeeper, missing)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("migrations applied: 0001_initial.sql")
    finally:
        admin = await asyncpg.connect("postgresql://postgres@127.0.0.1:5432/postgres")
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{missing}" WITH (FORCE)')
        finally:
            await admin.close()


async def test_a_bad_setting_is_one_line_not_a_traceback():
    result = await asyncio.to_thread(webhook_ingest, "migrate", env={"WEBHOOK_INGEST_DELIVERY_LIMIT": "many"})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr == (
        "error: bad environment: WEBHOOK_INGEST_DELIVERY_LIMIT: Input should be a valid"
        " integer, unable to parse string as an integer\n"
    )


async def test_the_preflight_needs_only_the_target_database(database, monkeypatch):
    async with PostgresGatekeeper(refused={"postgres"}) as gatekeeper:
        for target in (name_of(database), "wi_not_created_yet"):
            monkeypatch.setenv("DATABASE_URL", gatekeeper.url_for(target))
            problems = await service_problems(Settings())
            assert not [problem for problem in problems if problem.startswith("PostgreSQL")], problems
    assert "postgres" not in gatekeeper.asked_for


async def test_run_says_in_one_line_that_it_cannot_create_the_database(service_env, namespace):
    from tests.support.tcpproxy import free_port

    missing = f"wi_{namespace}_run"
    async with PostgresGatekeeper(refused={"postgres"}) as gatekeeper:
        env = {**service_env, "DATABASE_URL": gatekeeper.url_for(missing)}
        result = await asyncio.to_thread(webhook_ingest, "run", "--port", str(free_port()), env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"error: database '{missing}' does not exist and cannot be created here:")
