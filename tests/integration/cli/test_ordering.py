"""`webhook-ingest ordering blocked` and `ordering show` (webhook_ingest/cli/ordering.py;
docs/reference.md §2) against real Postgres, through click's CliRunner; the
runner (B) stubbed by rows written as it leaves them."""

import asyncio
import json

from click.testing import CliRunner

from tests.support.ordering_lanes import LANE, block_lane
from webhook_ingest.cli.main import main


def ordering(*args: str):
    return CliRunner().invoke(main, ["ordering", *args])


def test_blocked_lists_each_blocked_lane_with_its_age_and_dead_letter(settings):
    first = asyncio.run(block_lane(settings.database_url, minutes_ago=90))
    second = asyncio.run(block_lane(settings.database_url, "other#billing:inv_7", versions=1, minutes_ago=3))

    result = ordering("blocked")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["SOURCE", "ROUTE", "KEY", "SINCE", "AGE", "DEAD", "LETTER", "WAITING"]
    assert lines[1].split()[:3] == ["acme", "-", "obj_1"] and lines[1].split()[-3:] == ["1h", str(first), "2"]
    assert lines[2].split()[:3] == ["other", "billing", "inv_7"] and lines[2].split()[-3:] == ["3m", str(second), "0"]

    documents = [json.loads(line) for line in ordering("blocked", "--source", "acme", "--json").stdout.splitlines()]
    assert [(d["lane"], d["dead_letter_id"], d["waiting"], d["route"]) for d in documents] == [(LANE, first, 2, None)]
    assert 90 * 60 - 5 < documents[0]["age_seconds"] < 91 * 60


def test_blocked_says_so_when_nothing_is(settings):
    result = ordering("blocked")
    assert result.exit_code == 0 and result.stdout.strip() == "no ordering key is blocked"
    assert ordering("blocked", "--json").stdout == ""


def test_show_gives_a_lanes_holder_block_and_rows_in_the_order_they_run(settings):
    dead_letter_id = asyncio.run(block_lane(settings.database_url))

    result = ordering("show", LANE)
    assert result.exit_code == 0, result.stderr
    assert f"blocked:   by dead letter {dead_letter_id} since" in result.stdout
    assert f"`dlq replay {dead_letter_id}` runs it first" in result.stdout
    assert "held by:   nobody" in result.stdout and "waiting:   2 (seqs given: 3)" in result.stdout
    rows = result.stdout.split("in the order they run:\n")[1].splitlines()
    assert [line.split()[:2] for line in rows] == [["SEQ", "STATE"], ["1", "dead"], ["2", "pending"], ["3", "pending"]]

    document = json.loads(ordering("show", LANE, "--json").stdout)
    assert (document["blocked_by"], document["pending"], [row["seq"] for row in document["rows"]]) == (
        dead_letter_id,
        2,
        [1, 2, 3],
    )


def test_show_of_an_unknown_lane_fails_with_one_line(settings):
    result = ordering("show", "acme:nothing")
    assert result.exit_code != 0 and "no ordering lane 'acme:nothing'" in result.stderr
