"""The console's vendored htmx (ingress/console/vendor.py): the pinned file, and only it."""

import hashlib

from tests.support.repository import ROOT
from webhook_ingest.ingress.console import vendor

STATIC = ROOT / "ingress" / "console" / "static"


def test_the_vendored_htmx_is_the_pinned_file():
    script = STATIC / vendor.HTMX_FILE
    assert hashlib.sha256(script.read_bytes()).hexdigest() == vendor.HTMX_SHA256
    assert sorted(path.name for path in STATIC.glob("*.js")) == [vendor.HTMX_FILE]
