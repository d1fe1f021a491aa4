"""The repository's own files, as the static tests see them."""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def repository_files() -> list[Path]:
    """Tracked files and new ones not ignored: what a commit would hold."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    return [ROOT / name for name in listed if (ROOT / name).is_file()]
