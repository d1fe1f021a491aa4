"""The test suite's own RabbitMQ: one private node, started once per
session and killed at its end — never the machine's shared broker, which
a contributor runs for their own work (issue 21, item 8).

The node (tests/support/rabbit_cluster.py's `RabbitNode`) has its own name,
Erlang cookie, ports and data folder, so nothing of the suite can reach or
disturb another node. `start()` sets `AMQP_URL` and `TEST_RABBITMQCTL` in
the environment, so every test, every process a test starts and every tool
of ours that lists queues (`ctl_command()`) talks to this node. The node
also serves the management HTTP API on loopback, for `queue_names()`: the
suite lists queues after every few tests, and `rabbitmqctl` would start an
Erlang VM each time. A node that
stops answering mid-run (RabbitMQ 3.10 here wedged after hundreds of live
quorum queues) is the suite's own to restart: `restart()` kills it and
starts it again on the same port with an empty data folder.

`TEST_AMQP_URL` set to a broker's URL uses that broker instead (no private
node): for a developer who wants to watch a run in a broker's own tools.
"""

import atexit
import base64
import json
import os
import shlex
import shutil
import subprocess
import tempfile
import urllib.request
import uuid
from pathlib import Path
from urllib.parse import urlsplit

from tests.support.rabbit_cluster import CTL, RabbitNode

_node: RabbitNode | None = None
_base: Path | None = None
_url: str | None = None
_starting = False  # launched, not yet seen to answer


def start(wait: bool = True) -> str:
    """The suite's broker URL, starting the private node on the first call;
    `wait=False` returns as soon as its process is started (the URL is
    known: its port was chosen), and `await_started()` waits for it."""
    global _node, _base, _url, _starting
    external = os.environ.get("TEST_AMQP_URL")
    if external:
        os.environ["AMQP_URL"] = _url = external
        return external
    if _node is None:
        _base = Path(tempfile.mkdtemp(prefix="wi-test-rabbit-"))
        home = _base / "home"
        home.mkdir()
        cookie = home / ".erlang.cookie"
        cookie.write_text(uuid.uuid4().hex)
        cookie.chmod(0o400)
        _node = RabbitNode(_base, f"witest{uuid.uuid4().hex[:6]}@localhost", home, management=True)
        atexit.register(stop)
        _node.launch()
        _starting = True
        os.environ["TEST_RABBITMQCTL"] = shlex.join([CTL, "-n", _node.name, "--erlang-cookie", cookie.read_text()])
    os.environ["AMQP_URL"] = _url = _node.url()
    if wait:
        await_started()
    return _url


def await_started() -> None:
    """Until the private node, if any, answers (at once once it has)."""
    global _starting
    if _node is not None and _starting:
        _node.await_startup()
        _starting = False


def started() -> bool:
    return _url is not None


def amqp_url() -> str:
    return _url or start()


def amqp_port() -> int:
    """The port tests put a TCP proxy in front of."""
    return urlsplit(amqp_url()).port or 5672


def ctl_command() -> list[str]:
    """`rabbitmqctl` for the suite's broker (the private node's, with its cookie)."""
    return shlex.split(os.environ.get("TEST_RABBITMQCTL", "rabbitmqctl"))


def queue_names() -> list[str]:
    """Every queue of the suite's broker: over the private node's HTTP API,
    else (an external TEST_AMQP_URL broker) from `rabbitmqctl`."""
    api = _node.api_url() if _node is not None else None
    if api is None:
        listing = subprocess.run(
            [*ctl_command(), "-q", "list_queues", "name"], capture_output=True, text=True, timeout=60
        )
        return [line.strip() for line in listing.stdout.splitlines() if line.strip()]
    request = urllib.request.Request(
        f"{api}/queues/%2F?columns=name",
        headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()},
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        return [queue["name"] for queue in json.load(answer)]


def restart() -> bool:
    """Kills the private node and starts it empty on the same port; False without one."""
    if _node is None:
        return False
    _node.kill()
    shutil.rmtree(_node.folder / "data", ignore_errors=True)
    _node.start()
    return True


def stop() -> None:
    global _node, _base, _url, _starting
    _url, _starting = None, False
    if _node is not None:
        _node.kill()
        _node = None
    if _base is not None:
        shutil.rmtree(_base, ignore_errors=True)
        _base = None
