"""Three private RabbitMQ nodes of one cluster on free ports, for the
cluster fault run (`make chaos-cluster`); never the shared broker.

Each node has its own name (`wi<id>-<n>@localhost`), data and log folders,
AMQP and distribution ports, an empty plugin list (or the management
plugin alone, when asked for) and its own config; all
share a private Erlang cookie in a private HOME. The shared broker has
another cookie, so a command of ours can never reach it, even by mistake.
A node runs in its own process group, so it is killed (SIGKILL) or stopped
without touching any process but its own.
"""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from tests.support.tcpproxy import free_port

SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"  # not the /usr/sbin wrapper: it switches user and cookie
CTL = "/usr/lib/rabbitmq/bin/rabbitmqctl"


class RabbitNode:
    """`management=True` adds the management plugin's HTTP API on a free
    loopback port (`api_url()`), without its statistics collector: a way to
    list queues that costs a few milliseconds, where `rabbitmqctl` starts an
    Erlang VM (0.5-1.2 s of CPU a call)."""

    def __init__(self, base: Path, name: str, home: Path, management: bool = False):
        self.name = name
        self.folder = base / name.split("@")[0]
        self.folder.mkdir()
        self.port, self.dist_port = free_port(), free_port()
        self.api_port = free_port() if management else None
        config = f"listeners.tcp.default = 127.0.0.1:{self.port}\nloopback_users = none\n"
        if self.api_port is not None:
            config += (
                f"management.tcp.ip = 127.0.0.1\nmanagement.tcp.port = {self.api_port}\n"
                "management_agent.disable_metrics_collector = true\n"
            )
        (self.folder / "rabbitmq.conf").write_text(config)
        (self.folder / "env.conf").write_text("")
        (self.folder / "plugins").write_text("[rabbitmq_management].\n" if management else "[].\n")
        self.env = {
            **os.environ,
            "HOME": str(home),
            "RABBITMQ_CONF_ENV_FILE": str(self.folder / "env.conf"),  # not /etc/rabbitmq's (the shared node's name)
            "RABBITMQ_CONFIG_FILE": str(self.folder / "rabbitmq.conf"),
            "RABBITMQ_CONFIG_FILES": str(self.folder / "conf.d"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.folder / "advanced.config"),
            "RABBITMQ_NODENAME": name,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(self.folder / "data"),
            "RABBITMQ_LOG_BASE": str(self.folder / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.folder / "plugins"),
            "RABBITMQ_PID_FILE": str(self.folder / "pid"),
        }
        self.process: subprocess.Popen | None = None

    def url(self, user: str = "guest", password: str = "guest") -> str:
        return f"amqp://{user}:{password}@127.0.0.1:{self.port}/"

    def api_url(self) -> str | None:
        """The management HTTP API's base URL (user guest), None without the plugin."""
        return None if self.api_port is None else f"http://127.0.0.1:{self.api_port}/api"

    def start(self) -> None:
        self.launch()
        self.await_startup()

    def launch(self) -> None:
        """The node's process, not waited for (`await_startup()`)."""
        with open(self.folder / "out.log", "ab") as log:
            self.process = subprocess.Popen(
                [SERVER], env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def await_startup(self, timeout: float = 120) -> None:
        """Until the node answers an AMQP handshake, and its management API
        when it has one. RabbitMQ opens its client listeners last, after its
        plugins (its log: "Ready to start client connection listeners", then
        "Server startup complete"); `rabbitmqctl await_startup` answered
        ~0.2 s later, each call an Erlang VM's start (~1.1 s of CPU), at the
        start of every test process of `make test` at once."""
        deadline = time.monotonic() + timeout
        while not (self._answers_amqp() and self._answers_api()):
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"RabbitMQ node {self.name} exited while starting: see {self.folder / 'out.log'}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"RabbitMQ node {self.name} did not start within {timeout:.0f}s")
            time.sleep(0.1)

    def _answers_amqp(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
                sock.sendall(b"AMQP\x00\x00\x09\x01")
                return sock.recv(1) == b"\x01"  # a method frame: Connection.Start
        except OSError:
            return False

    def _answers_api(self) -> bool:
        if self.api_port is None:
            return True
        try:
            with urllib.request.urlopen(f"{self.api_url()}/overview", timeout=5):
                return True
        except urllib.error.HTTPError as exc:
            return exc.code == 401  # answering: the plugin is up (no credentials sent)
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL to the node's whole process group: a crashed machine."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        self.process = None

    def stop(self) -> None:
        """A clean stop, as for a rolling restart."""
        self.ctl("stop", timeout=120)
        if self.process is not None:
            self.process.wait(timeout=60)
        self.process = None

    def ctl(self, *args: str, timeout: float = 60) -> str:
        done = subprocess.run(
            [CTL, "-n", self.name, *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if done.returncode != 0:
            raise RuntimeError(f"rabbitmqctl -n {self.name} {' '.join(args)}: {done.stderr.strip() or done.stdout}")
        return done.stdout


class RabbitCluster:
    def __init__(self, size: int = 3):
        self.base = Path(tempfile.mkdtemp(prefix="wi-rabbit-cluster-"))
        home = self.base / "home"
        home.mkdir()
        cookie = home / ".erlang.cookie"
        cookie.write_text(uuid.uuid4().hex)
        cookie.chmod(0o400)
        run_id = uuid.uuid4().hex[:6]
        self.nodes = [RabbitNode(self.base, f"wi{run_id}-{n}@localhost", home) for n in range(1, size + 1)]

    @property
    def amqp_url(self) -> str:
        """Every node, comma-separated: what AMQP_URL holds for a cluster."""
        return ",".join(node.url() for node in self.nodes)

    def start(self) -> "RabbitCluster":
        first, *others = self.nodes
        first.start()
        for node in others:
            node.start()
            node.ctl("stop_app")
            node.ctl("join_cluster", first.name)
            node.ctl("start_app", timeout=120)
        return self

    def running_nodes(self) -> str:
        return self.nodes[0].ctl("cluster_status", "--formatter", "json")

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> "RabbitCluster":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()
