"""A replay by selection of an ordered source (docs/design.md, "Ordering
keys"): each item goes into its *live* lane under its replay key, in the
item's own transaction, in selection order, after whatever the lane held
then; nothing is published for it, and a lane it made busy is woken once
the item's step committed. Other sources' items are published as before;
a routed source's event goes to its ordered routes' lanes and is published
for the rest. The CLI refuses a selection of a source with lanes when it
cannot read the sources file. The runner (B) is not needed: the rows are
read as it would take them."""

import asyncio
from datetime import UTC, datetime, timedelta

import aio_pika
import asyncpg
from click.testing import CliRunner

from tests.support.archive import archived_event, seed_archive
from tests.support.event_replays import claimed_replay, replay_job
from tests.support.events import make_event
from tests.support.ingress import queued_events
from webhook_ingest.cli.dlq import confirm_channel
from webhook_ingest.cli.main import main
from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.ordering import insert_ordered, ordered_row
from webhook_ingest.shared.replays.store import EventReplayStore
from webhook_ingest.shared.runs.paced import run
from webhook_ingest.shared.sources.model import parse_source

NOW = datetime.now(UTC).replace(microsecond=0)
BASE = {"scheme": "stripe", "secrets": ["s"]}
ORDERED = parse_source("acme", {**BASE, "handler": "inbox", "ordering": {"key": "body:obj"}})
ROUTED = parse_source(
    "shop",
    {
        **BASE,
        "routes": [
            {"name": "billing", "handler": "inbox", "ordering": {"key": "body:obj"}},
            {"name": "audit", "handler": "inbox"},
        ],
    },
)


def at(minutes_ago: int) -> datetime:
    return NOW - timedelta(minutes=minutes_ago)


async def lanes(database_url: str) -> dict[str, list[tuple[int, str, int]]]:
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch("SELECT lane, seq, key, replay_of FROM ordered_events ORDER BY lane, seq")
    finally:
        await connection.close()
    found: dict[str, list[tuple[int, str, int]]] = {}
    for row in rows:
        found.setdefault(row["lane"], []).append((row["seq"], row["key"], row["replay_of"]))
    return found


async def replayed(settings, source: str, sources: dict) -> int:
    """A replay of `source`'s archived events run to its end; its id."""
    connection = await asyncpg.connect(settings.database_url)
    amqp = await aio_pika.connect(settings.amqp_url)
    try:
        channel = await amqp.channel(publisher_confirms=True)
        await topology.declare_events_queue(channel, settings.namespace, settings.delivery_limit)
        store = EventReplayStore(connection)
        claimed = await claimed_replay(store, source)
        assert await run(replay_job(claimed, store, channel, settings.namespace, sources=sources)) == "done"
        return claimed.id
    finally:
        await amqp.close()
        await connection.close()


async def wake_ups(settings) -> list[str | None]:
    connection = await aio_pika.connect(settings.amqp_url)
    try:
        queue = await topology.declare_ordering_queue(await connection.channel(), settings.namespace)
        woken = []
        while (message := await queue.get(no_ack=True, fail=False)) is not None:
            woken.append(topology.woken_lane(message))
        return woken
    finally:
        await connection.close()


async def test_items_of_an_ordered_source_join_their_live_lanes_in_selection_order(settings):
    await wake_ups(settings)  # the ordering queue declared, as the ingress declares it
    a_1 = archived_event("acme", "evt_1", at(30), obj="a", version=1)
    b_1 = archived_event("acme", "evt_2", at(20), obj="b", version=1)
    a_2 = archived_event("acme", "evt_3", at(10), obj="a", version=2)
    await seed_archive(settings.database_url, [a_1, b_1, a_2])
    connection = await asyncpg.connect(settings.database_url)
    try:  # lane a holds a live event already
        await insert_ordered(connection, [ordered_row(make_event("acme", "evt_live"), "acme:a", None)])
    finally:
        await connection.close()

    replay_id = await replayed(settings, "acme", {"acme": ORDERED})

    r = f"replay-{replay_id}/"
    assert await lanes(settings.database_url) == {
        "acme:a": [(1, "acme:evt_live", 0), (2, f"{r}acme:evt_1", 0), (3, f"{r}acme:evt_3", 0)],
        "acme:b": [(1, f"{r}acme:evt_2", 0)],
    }  # each under its replay key, a chain of its own (replay_of 0), as its published message would be
    assert await queued_events(settings.amqp_url, settings.namespace) == []  # nothing published
    assert await wake_ups(settings) == ["acme:b"]  # a was busy already: its holder goes on to them


async def test_other_sources_items_are_published_and_a_routed_one_goes_to_its_ordered_routes_lane(settings):
    plain = archived_event("github", "d-1", at(30), obj="a")
    routed = archived_event("shop", "o-1", at(20), obj="x")
    unkeyed = archived_event("acme", "evt_9", at(10))  # no `obj`: the key resolves to nothing, unordered
    await seed_archive(settings.database_url, [plain, routed, unkeyed])
    sources = {"acme": ORDERED, "shop": ROUTED}

    github = await replayed(settings, "github", sources)
    shop = await replayed(settings, "shop", sources)
    acme = await replayed(settings, "acme", sources)

    assert await lanes(settings.database_url) == {
        "shop#billing:x": [(1, f"replay-{shop}/shop:o-1#billing", 0)],
    }
    published = await queued_events(settings.amqp_url, settings.namespace)
    assert sorted(event.key for event in published) == sorted(
        [f"replay-{github}/github:d-1", f"replay-{shop}/shop:o-1", f"replay-{acme}/acme:evt_9"]
    )  # shop's for its unordered route `audit` (the worker fans it out)


def test_the_cli_refuses_a_source_with_lanes_when_it_cannot_read_the_sources_file(settings, tmp_path, monkeypatch):
    asyncio.run(seed_archive(settings.database_url, [archived_event("acme", "evt_1", at(30), obj="a")]))

    async def a_lane() -> None:
        connection = await asyncpg.connect(settings.database_url)
        try:
            await insert_ordered(connection, [ordered_row(make_event("acme", "evt_0"), "acme:a", None)])
        finally:
            await connection.close()

    asyncio.run(a_lane())
    unreadable = tmp_path / "sources.toml"
    unreadable.write_text('[sources.acme]\nscheme = "stripe"\nsecrets = ["${UNSET_SECRET_OF_THIS_TEST}"]\n')
    monkeypatch.setenv("WEBHOOK_INGEST_SOURCES", str(unreadable))
    monkeypatch.delenv("UNSET_SECRET_OF_THIS_TEST", raising=False)

    async def declared() -> None:
        async with confirm_channel(settings):
            pass

    asyncio.run(declared())
    result = CliRunner().invoke(main, ["events", "replay", "--source", "acme", "--yes"])
    assert result.exit_code != 0
    assert "has ordering keys" in result.stderr and "acme" in result.stderr
    assert asyncio.run(queued_events(settings.amqp_url, settings.namespace)) == []
