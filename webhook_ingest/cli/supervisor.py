"""`webhook-ingest run`: the ingress and N workers as child processes.

A child that dies is restarted (after a short pause, so a crash loop does not
spin); Ctrl-C or SIGTERM stops them all, workers gracefully, and kills
(SIGKILL) a child still running `KILL_AFTER` seconds later.
"""

import asyncio
import signal
import sys

from webhook_ingest.shared.observability import get_logger

from . import layout

log = get_logger(__name__)
RESTART_PAUSE = 1.0
# The longest grace of a child (the ingress's, for requests in flight), and
# 5 s to close its connections, each of which has a limit of its own.
KILL_AFTER = max(layout.INGRESS_GRACE, layout.WORKER_GRACE) + 5.0


class Supervisor:
    def __init__(self, commands: dict[str, list[str]]):
        self._commands = commands  # child name -> argv after `webhook-ingest`
        self._children: dict[str, asyncio.subprocess.Process] = {}
        self._stopping = asyncio.Event()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self._stopping.set)
        keepers = [asyncio.create_task(self._keep_running(name)) for name in self._commands]
        await self._stopping.wait()
        log.info("stopping_children", count=len(self._children))
        for child in self._children.values():
            if child.returncode is None:
                child.terminate()
        await asyncio.wait(keepers, timeout=KILL_AFTER)
        for name, child in self._children.items():
            if child.returncode is None:
                log.warning("child_killed", child=name, pid=child.pid, seconds_after_sigterm=KILL_AFTER)
                child.kill()
        await asyncio.gather(*keepers)

    async def _keep_running(self, name: str) -> None:
        while not self._stopping.is_set():
            child = await asyncio.create_subprocess_exec(sys.executable, "-m", "webhook_ingest", *self._commands[name])
            self._children[name] = child
            log.info("child_started", child=name, pid=child.pid)
            if self._stopping.is_set():  # started while the others were told to stop
                child.terminate()
            code = await child.wait()
            if self._stopping.is_set():
                return
            log.warning("child_exited_restarting", child=name, code=code)
            await asyncio.sleep(RESTART_PAUSE)
