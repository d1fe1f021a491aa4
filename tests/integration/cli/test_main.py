"""The `webhook-ingest` command as a newcomer meets it: real processes."""

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
import asyncpg
import orjson
from aiohttp import web

from tests.conftest import database_url
from tests.support.broker import amqp_port
from tests.support.processes import Process, wait_for_output
from tests.support.tcpproxy import free_port
from webhook_ingest.shared import signatures
from webhook_ingest.shared.settings import ENVIRONMENT_VARIABLES


def webhook_ingest(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "webhook_ingest", *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_every_command_lists_the_environment_variables():
    for command in ([], ["migrate"], ["ingress"], ["worker"], ["run"], ["send-test"], ["dlq"], ["prune"]):
        result = webhook_ingest(*command, "--help")
        assert result.returncode == 0, result.stderr
        for name, _ in ENVIRONMENT_VARIABLES:
            assert name in result.stdout, (command, name)


def test_a_bad_sources_file_stops_each_process_with_one_line(tmp_path, service_env):
    path = tmp_path / "sources.toml"
    path.write_text('[sources.acme]\nscheme = "github"\nsecrets = ["s"]\nhandler = "inbox"\nmax_attempts = -1\n')
    env = {**service_env, "WEBHOOK_INGEST_SOURCES": str(path)}
    for command in (["ingress", "--port", str(free_port())], ["worker"], ["run", "--port", str(free_port())]):
        result = webhook_ingest(*command, env=env)
        assert result.returncode != 0
        assert result.stderr.strip() == "error: source 'acme': max_attempts: must be a positive integer", command
        assert "Traceback" not in result.stdout + result.stderr


async def test_a_handler_that_cannot_be_imported_stops_the_workers_not_the_ingress(fleet, tmp_path, service_env):
    path = tmp_path / "sources.toml"
    path.write_text('[sources.acme]\nscheme = "hmac-sha256"\nsecrets = ["s"]\nhandler = "no_such_module_xyz:handle"\n')
    env = {"WEBHOOK_INGEST_SOURCES": str(path)}
    for command in (["worker"], ["run", "--port", str(free_port())]):
        result = webhook_ingest(*command, env={**service_env, **env})
        assert result.returncode == 2
        assert result.stderr.strip() == (
            "error: source 'acme': handler: cannot import 'no_such_module_xyz': No module named 'no_such_module_xyz';"
            f" install it into this Python environment ({sys.prefix}) or put its folder on PYTHONPATH"
            " (the current directory is not on the webhook-ingest command's import path)"
        ), command
    ingress, base_url = fleet.ingress(env=env)  # it never imports handler code
    await wait_for_output(ingress, "broker_connected")
    body = orjson.dumps({"id": "evt_1"})
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{base_url}/webhooks/acme", data=body, headers=signatures.sign("hmac-sha256", body, "s")
        ) as response:
            assert response.status == 200


def test_run_names_each_unreachable_service_and_how_to_start_it(service_env):
    closed = free_port()
    env = {
        **service_env,
        "REDIS_URLS": f"redis://127.0.0.1:{closed}/0",
        "AMQP_URL": f"amqp://guest:secret@127.0.0.1:{free_port()}/",
    }
    result = webhook_ingest("run", "--port", str(free_port()), env=env)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2 and "Traceback" not in result.stderr
    assert lines[0].startswith(f"error: Redis is not reachable at redis://127.0.0.1:{closed}/0")
    assert "redis-server --daemonize yes" in lines[0] and "docker compose up -d" in lines[0]
    assert lines[1].startswith("error: RabbitMQ is not reachable at amqp://guest:***@")  # password masked
    assert "rabbitmq-server -detached" in lines[1]


def test_run_tells_a_service_that_refuses_its_credentials_from_one_that_is_down(service_env):
    role_url = service_env["DATABASE_URL"].replace("//postgres@", "//no_such_role_xyz@")
    env = {
        **service_env,
        "DATABASE_URL": role_url,
        "REDIS_URLS": "redis://nobody:wrong@127.0.0.1:6379/0",
        "AMQP_URL": f"amqp://guest:wrong@127.0.0.1:{amqp_port()}/",
    }
    result = webhook_ingest("run", "--port", str(free_port()), env=env)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert [line.split(" refused ")[0] for line in lines] == [
        f"error: PostgreSQL at {role_url}",
        "error: Redis at redis://nobody:***@127.0.0.1:6379/0",
        f"error: RabbitMQ at amqp://guest:***@127.0.0.1:{amqp_port()}/",
    ], lines
    for line, variable in zip(lines, ("DATABASE_URL", "REDIS_URLS", "AMQP_URL")):
        assert "refused the credentials (" in line and f"check the user and password in {variable}" in line
        assert "start it" not in line

    env = {
        **service_env,
        "REDIS_URLS": "redis://127.0.0.1:6379/99",
        "AMQP_URL": f"amqp://guest:guest@127.0.0.1:{amqp_port()}/no_such_vhost_xyz",
    }
    result = webhook_ingest("run", "--port", str(free_port()), env=env)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    redis_line, rabbit_line = result.stderr.strip().splitlines()
    assert redis_line.startswith("error: Redis at redis://127.0.0.1:6379/99 has no database 99 (")
    assert rabbit_line.startswith(
        f"error: RabbitMQ at amqp://guest:***@127.0.0.1:{amqp_port()}/no_such_vhost_xyz refused"
        " the virtual host 'no_such_vhost_xyz' ("
    )
    assert "rabbitmqctl add_vhost no_such_vhost_xyz" in rabbit_line and "start it" not in rabbit_line


async def test_two_concurrent_migrations_create_the_database_and_apply_each_file_once(namespace):
    name = f"wi_{namespace}_fresh"
    env = {"DATABASE_URL": database_url(name), "LOG_FORMAT": "json"}
    try:
        first, second = await asyncio.gather(
            asyncio.to_thread(webhook_ingest, "migrate", env=env),
            asyncio.to_thread(webhook_ingest, "migrate", env=env),
        )
        assert (first.returncode, second.returncode) == (0, 0), first.stderr + second.stderr
        outputs = sorted([first.stdout.strip(), second.stdout.strip()])
        assert outputs[0] == "database is up to date" and outputs[1].startswith("migrations applied: 0001_initial.sql")
        connection = await asyncpg.connect(database_url(name))
        try:
            tables = {
                r["tablename"]
                for r in await connection.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
            }
            assert {"processed_events", "inbox", "dead_letters"} <= tables
        finally:
            await connection.close()
        assert webhook_ingest("migrate", env=env).stdout.strip() == "database is up to date"
    finally:
        admin = await asyncpg.connect(database_url("postgres"))
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


def test_migrate_with_postgres_unreachable_is_one_line(service_env):
    result = webhook_ingest("migrate", env={"DATABASE_URL": f"postgresql://postgres@127.0.0.1:{free_port()}/x"})
    assert result.returncode != 0
    assert result.stderr.startswith("error: cannot reach PostgreSQL") and "Traceback" not in result.stderr


async def test_two_ingress_processes_share_one_port_with_reuse_port(fleet, settings):
    port = free_port()
    first, base_url = fleet.ingress(port, reuse_port=True)
    second, _ = fleet.ingress(port, reuse_port=True)
    for process in (first, second):
        await wait_for_output(process, "broker_connected")
    statuses = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
        for n in range(20):  # a new connection each: the kernel spreads them over both
            body = orjson.dumps({"id": f"evt_{n}"})
            headers = signatures.sign("hmac-sha256", body, "demo-secret")
            async with session.post(f"{base_url}/webhooks/demo", data=body, headers=headers) as response:
                statuses.append(response.status)
    assert statuses == [200] * 20
    assert first.popen.poll() is None and second.popen.poll() is None  # the second bound the same port


def command_line(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def run_children(run: Process) -> list[int]:
    with open(f"/proc/{run.pid}/task/{run.pid}/children") as children:
        return [int(pid) for pid in children.read().split()]


async def stop_run(run: Process) -> int:
    """SIGTERM to `run`, as Ctrl-C would; its children go with it (the fleet's SIGKILL would orphan them)."""
    children = run_children(run) if run.popen.poll() is None else []
    try:
        return await asyncio.to_thread(run.terminate, 30)
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


async def test_run_on_another_port_prints_a_send_test_line_that_reaches_it(fleet, service_env):
    port = free_port()
    run = fleet.supervisor("--port", str(port), "--ingress-processes", "1", "--workers", "1")
    try:
        await wait_for_output(run, "broker_connected")
        [line] = [line for line in run.output().splitlines() if line.startswith("try it:")]
        assert line.split(None, 2)[2] == f"webhook-ingest send-test demo --url http://127.0.0.1:{port}"
        followed = await asyncio.to_thread(webhook_ingest, *line.split()[3:], env=service_env)
        assert followed.returncode == 0 and followed.stdout.startswith("200 "), followed
    finally:
        assert await stop_run(run) == 0


async def test_send_test_fails_when_an_answer_is_not_2xx():
    runner = web.AppRunner(web.Application())  # no routes: every POST is answered 404
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        result = await asyncio.to_thread(webhook_ingest, "send-test", "demo", "--url", f"http://127.0.0.1:{port}")
    finally:
        await runner.cleanup()
    assert result.stdout.startswith("404 ")  # every answer is still printed
    assert result.returncode != 0
    assert result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1, result.stderr


def listening(port: int, reuse_port: bool) -> socket.socket:
    """A socket listening on 127.0.0.1:port — with reuse_port, as another deployment's ingress processes do."""
    sock = socket.socket()
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


def test_an_ingress_on_a_busy_port_fails_with_one_line(service_env):
    port = free_port()
    with listening(port, reuse_port=False):
        result = webhook_ingest("ingress", "--port", str(port), env=service_env, timeout=30)
    assert result.returncode != 0
    assert result.stderr.startswith(f"error: port {port} is in use: "), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


async def test_run_on_a_port_another_deployment_listens_on_fails_with_one_line(fleet, service_env):
    port = free_port()
    with listening(port, reuse_port=True):
        run = fleet.supervisor("--port", str(port), "--ingress-processes", "2", "--workers", "1")
        try:
            code = await asyncio.to_thread(run.popen.wait, 5)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            await stop_run(run)
    lines = run.output().splitlines()
    assert code == 2 and lines == [f"error: port {port} is in use: {lines[0].split(': ', 2)[2]}"], lines
    assert "child_started" not in run.output()


async def test_run_kills_a_child_still_running_after_its_grace_and_says_so(fleet):
    run = fleet.supervisor(
        "--port",
        str(free_port()),
        "--ingress-processes",
        "1",
        "--workers",
        "1",
        # 3 s: the worker, which stops on its own, must not be the one killed
        # on a loaded host (0.5 s was not enough at load 16).
        prelude="from webhook_ingest.cli import supervisor\nsupervisor.KILL_AFTER = 3.0",
    )
    stopped: list[int] = []
    try:
        await wait_for_output(run, "broker_connected")
        [ingress] = [pid for pid in run_children(run) if "ingress" in command_line(pid)]
        os.kill(ingress, signal.SIGSTOP)  # it cannot act on SIGTERM
        stopped.append(ingress)
        run.popen.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(run.popen.wait, 10)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        await stop_run(run)
    killed = [orjson.loads(line) for line in run.output().splitlines() if '"child_killed"' in line]
    assert code == 0 and [(line["child"], line["pid"]) for line in killed] == [("ingress-1", ingress)], killed
