"""Who acts (docs/reference.md §8): every replay, discard, pause, resume
and cancel names an `Actor` in the audit log (`shared/audit/log.py`)."""

import getpass
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Actor:
    """Who replays or discards, for the audit log: a token's role
    (`operator`, `viewer`) through the `console` or the `admin-api`, or
    `cli` with the OS user who ran the command."""

    role: str
    via: str
    name: str | None = None

    @classmethod
    def cli(cls) -> "Actor":
        return cls("cli", "cli", os_user())

    def __str__(self) -> str:
        return f"{self.role}:{self.name}" if self.name else f"{self.role} ({self.via})"


UNKNOWN_ACTOR = Actor("unknown", "unknown")


def os_user() -> str:
    """The login name; a container without a passwd entry has only a uid."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"
