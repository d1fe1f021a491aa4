"""workers.acks: one `multiple` ack only when it covers exactly the batch."""

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from webhook_ingest.workers.acks import OpenDeliveries


class Channel:
    is_closed = False


@dataclass(eq=False)
class Delivery:
    channel: Channel
    delivery_tag: int


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


@given(st.sets(st.integers(1, 60), min_size=1), st.data())
def test_a_multiple_ack_never_covers_a_message_outside_the_batch(open_tags, data):
    deliveries, messages = open_deliveries(Channel(), sorted(open_tags))
    batch = data.draw(st.lists(st.sampled_from(sorted(open_tags)), min_size=1, unique=True))
    last = deliveries.covering([messages[t] for t in batch])
    if last is not None:
        covered = {t for t in open_tags if t <= last.delivery_tag}
        assert covered == set(batch)
    else:
        assert len(batch) < 2 or {t for t in open_tags if t <= max(batch)} != set(batch)
