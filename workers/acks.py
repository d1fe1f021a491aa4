"""One `multiple` ack for a whole batch, when that is exactly the batch.

`basic.ack(multiple=True)` acknowledges every unacknowledged delivery of
the channel up to its tag. It is safe for a batch only if no other delivery
at or below the batch's last tag is still open — one waiting in another
batch, a copy waiting for its first, a message still being decoded. So
every delivery is recorded here until it is settled (ack, nack or reject),
and a batch gets one frame only when its messages are all the channel's
open deliveries up to its last tag; otherwise each message is acked on its
own. A frame saved is CPU saved on both sides: ours and the broker's.
"""

from aio_pika.abc import AbstractIncomingMessage


class OpenDeliveries:
    def __init__(self):
        self._open: dict[object, set[int]] = {}  # channel -> delivery tags not yet settled

    def delivered(self, message: AbstractIncomingMessage) -> None:
        channel = _channel_of(message)
        if channel is None:
            return
        if channel not in self._open:  # a new channel (a reconnect): forget closed ones
            for closed in [c for c in self._open if c.is_closed]:
                del self._open[closed]
        self._open.setdefault(channel, set()).add(message.delivery_tag)

    def settled(self, messages: list[AbstractIncomingMessage]) -> None:
        for message in messages:
            tags = self._open.get(_channel_of(message))
            if tags is not None:
                tags.discard(message.delivery_tag)
                if not tags:
                    del self._open[_channel_of(message)]

    def covering(self, messages: list[AbstractIncomingMessage]) -> AbstractIncomingMessage | None:
        """The message whose `multiple` ack settles exactly `messages`, or None."""
        channel = _channel_of(messages[0])
        if len(messages) < 2 or channel is None or any(_channel_of(m) is not channel for m in messages):
            return None
        last = max(messages, key=lambda message: message.delivery_tag)
        batch = {message.delivery_tag for message in messages}
        open_tags = self._open.get(channel, set())
        if not batch <= open_tags:
            return None
        if any(tag <= last.delivery_tag and tag not in batch for tag in open_tags):
            return None
        return last


def _channel_of(message: AbstractIncomingMessage):
    try:
        return message.channel
    except Exception:  # noqa: BLE001 - closed: its deliveries cannot be acked any more
        return None
