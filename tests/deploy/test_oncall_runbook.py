"""The on-call runbook has a section for every alert's `runbook_url`, and
its own links point at headings it has. Static, no services."""

import re
from pathlib import Path

import yaml

from tests.support.markdown import heading_anchors

ROOT = Path(__file__).resolve().parents[2]
RUNBOOK = ROOT / "docs" / "oncall.md"
ALERTS_FILE = ROOT / "deploy" / "prometheus" / "alerts.yml"
REQUIRED_ANCHORS = {
    "ingress-5xx",
    "ingress-unavailable",
    "outbox-backlog",
    "dead-letters",
    "slow-processing",
    "idempotency-store-degraded",
    "conflicts",
    "dead-letters-not-recorded",
    "silent-workers",
    "a-blocked-key-at-night",
    "ordering-keys-nobody-runs",
}


def test_anchor_rule():
    assert heading_anchors("# Ingress 5xx\n## `dlq` replay, after a fix!\n```\n# not a heading\n```\n") == {
        "ingress-5xx",
        "dlq-replay-after-a-fix",
    }


def test_every_alert_links_to_a_section_of_the_runbook():
    anchors = heading_anchors(RUNBOOK.read_text())
    document = yaml.safe_load(ALERTS_FILE.read_text())
    linked = {
        rule["annotations"]["runbook_url"].split("#", 1)[1] for group in document["groups"] for rule in group["rules"]
    }
    assert linked == REQUIRED_ANCHORS
    assert REQUIRED_ANCHORS <= anchors, sorted(REQUIRED_ANCHORS - anchors)


def test_the_runbook_links_only_to_its_own_headings():
    text = RUNBOOK.read_text()
    links = set(re.findall(r"\]\(#([^)]+)\)", text))
    assert links and links <= heading_anchors(text), sorted(links - heading_anchors(text))


def test_the_runbook_shows_the_on_call_commands():
    text = RUNBOOK.read_text()
    for command in (
        "dlq list",
        "dlq show",
        "dlq replay",
        "--all --source",
        "dlq discard",
        "webhook_events_total",
        "webhook_dead_letters_open",
        "/admin/dead-letters",
        "ordering blocked",
        "/admin/ordering/blocked",
    ):
        assert command in text, command
