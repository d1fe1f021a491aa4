"""workers.acks: one `multiple` ack only when it covers exactly the batch."""

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from webhook_ingest.workers.acks import OpenDeliveries


class Channel:
    is_closed = False


@dataclass(eq=False)
class Delivery:
    """An incoming message whose settlement frames are written down (or fail)."""

    channel: Channel
    delivery_tag: int
    frames: list | None = None
    fails: bool = False

    async def ack(self, multiple: bool = False) -> None:
        await self._send("ack_multiple" if multiple else "ack")

    async def reject(self, requeue: bool = False) -> None:
        await self._send("reject")

    async def _send(self, kind: str) -> None:
        if self.fails:
            raise ConnectionError("channel closed")
        if self.frames is not None:
            self.frames.append((kind, self.delivery_tag))


def open_deliveries(channel: Channel, tags) -> tuple[OpenDeliveries, dict[int, Delivery]]:
    deliveries = OpenDeliveries()
    messages = {tag: Delivery(channel, tag) for tag in tags}
    for message in messages.values():
        deliveries.delivered(message)
    return deliveries, messages


def test_a_batch_that_is_every_open_delivery_up_to_its_last_gets_one_ack():
    deliveries, messages = open_deliveries(Channel(), range(1, 11))
    assert deliveries.covering([messages[t] for t in (3, 1, 2)]) is messages[3]


def test_an_open_delivery_below_the_batch_forbids_it():
    deliveries, messages = open_deliveries(Channel(), range(1, 11))
    assert deliveries.covering([messages[t] for t in (2, 3)]) is None  # 1 is still open
    deliveries.settled([messages[1]])
    assert deliveries.covering([messages[t] for t in (2, 3)]) is messages[3]


def test_deliveries_of_another_channel_never_share_an_ack():
    first, second = Channel(), Channel()
    deliveries = OpenDeliveries()
    a, b = Delivery(first, 1), Delivery(second, 2)
    for message in (a, b):
        deliveries.delivered(message)
    assert deliveries.covering([a, b]) is None


def test_a_delivery_not_recorded_yet_below_the_batch_forbids_it():
    """Tag 2 reached the channel but its callback has not run yet."""
    deliveries, messages = open_deliveries(Channel(), [1, 3, 4])
    assert deliveries.covering([messages[t] for t in (1, 3, 4)]) is None
    deliveries.delivered(Delivery(messages[1].channel, 2))
    deliveries.settled([Delivery(messages[1].channel, 2)])
    assert deliveries.covering([messages[t] for t in (1, 3, 4)]) is messages[4]


def test_a_new_channel_after_a_reconnect_counts_its_tags_apart():
    old = Channel()
    deliveries, held = open_deliveries(old, [1, 2, 3])
    old.is_closed = True  # the connection dropped with 1–3 unsettled
    new = Channel()
    fresh = {tag: Delivery(new, tag) for tag in (1, 2, 3)}
    for message in fresh.values():
        deliveries.delivered(message)
    deliveries.settled([held[2]])  # an old delivery's late ack settles nothing new
    assert deliveries.covering([fresh[1], fresh[3]]) is None  # 2 on the new channel is still open
    assert deliveries.covering(list(fresh.values())) is fresh[3]
    assert deliveries.covering([held[1], held[2], held[3]]) is None  # a closed channel's: no frame at all


async def test_a_batch_that_is_exactly_the_open_deliveries_is_one_frame_else_one_each():
    frames: list = []
    deliveries, messages = open_deliveries(Channel(), range(1, 6))
    for message in messages.values():
        message.frames = frames
    await deliveries.ack_batch([messages[t] for t in (2, 3)])  # 1 is open below them
    await deliveries.ack_batch([messages[t] for t in (1, 4, 5)])
    assert frames == [("ack", 2), ("ack", 3), ("ack_multiple", 5)]


async def test_a_failed_settlement_leaves_its_deliveries_open_whether_one_frame_or_many():
    deliveries, messages = open_deliveries(Channel(), range(1, 7))
    messages[1].fails = True
    await deliveries.reject(messages[1])  # did not go out: must not be acked by a later frame
    assert deliveries.covering([messages[t] for t in (2, 3)]) is None
    messages[3].fails = True
    await deliveries.ack_batch([messages[t] for t in (1, 2, 3)])  # the multiple frame fails
    await deliveries.ack_batch([messages[2]])
    assert deliveries.covering([messages[t] for t in (4, 5)]) is None  # 1 and 3 never settled: still open
    deliveries.settled([messages[1], messages[3]])
    assert deliveries.covering([messages[t] for t in (4, 5)]) is messages[5]


@given(st.sets(st.integers(1, 60), min_size=1), st.data())
def test_a_multiple_ack_never_covers_a_message_outside_the_batch(open_tags, data):
    """Tags 1–60 delivered, those outside `open_tags` settled since."""
    deliveries, messages = open_deliveries(Channel(), range(1, 61))
    deliveries.settled([messages[t] for t in range(1, 61) if t not in open_tags])
    batch = data.draw(st.lists(st.sampled_from(sorted(open_tags)), min_size=1, unique=True))
    last = deliveries.covering([messages[t] for t in batch])
    if last is not None:
        covered = {t for t in open_tags if t <= last.delivery_tag}
        assert covered == set(batch)
    else:
        assert len(batch) < 2 or {t for t in open_tags if t <= max(batch)} != set(batch)
