"""Settling deliveries: one `multiple` ack for a whole batch, when that is
exactly the batch.

`basic.ack(multiple=True)` acknowledges every unacknowledged delivery of
the channel up to its tag. It is safe for a batch only if no other delivery
at or below the batch's last tag is still open — one in its handler, one
waiting in another batch, a copy waiting for its first, a message still
being decoded — nor was delivered without our knowing. So every delivery
is recorded here when it arrives, and stays open until its ack, nack or
reject went out; a batch gets one frame only when its messages are all the
channel's open deliveries up to its last tag and every tag up to it was
recorded (tags count 1, 2, 3… per channel, and start again at 1 on the
channel a reconnect opens, which is tracked apart). Otherwise each message
is acked on its own. A frame saved is CPU saved on both sides: ours and
the broker's (a quorum queue logs every ack frame).

A settlement that fails leaves its deliveries open — whether one frame or
many — so no later `multiple` ack can cover them: a message whose reject
did not go out must not be acked by another's frame. The broker redelivers
them when their channel closes.
"""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import cast

from aio_pika.abc import AbstractIncomingMessage
from aiormq.abc import AbstractChannel

from webhook_ingest.shared.observability import get_logger

log = get_logger(__name__)


@dataclass
class _Channel:
    open: set[int] = field(default_factory=set)  # delivery tags not yet settled
    seen_through: int = 0  # every tag up to this one was recorded
    seen_above: set[int] = field(default_factory=set)  # recorded past a tag not yet seen

    def record(self, tag: int) -> None:
        self.open.add(tag)
        self.seen_above.add(tag)
        while self.seen_through + 1 in self.seen_above:
            self.seen_through += 1
            self.seen_above.discard(self.seen_through)


class OpenDeliveries:
    def __init__(self):
        self._channels: dict[AbstractChannel, _Channel] = {}

    def open_count(self) -> int:
        """Deliveries not yet settled: the worker's messages in flight (its heartbeat)."""
        return sum(len(state.open) for channel, state in self._channels.items() if not channel.is_closed)

    def delivered(self, message: AbstractIncomingMessage) -> None:
        """Call first thing when a message arrives, before anything awaits."""
        channel = _channel_of(message)
        if channel is None:
            return
        if channel not in self._channels:  # a new channel (a reconnect): forget closed ones
            for closed in [c for c in self._channels if c.is_closed]:
                del self._channels[closed]
            self._channels[channel] = _Channel()
        self._channels[channel].record(_tag(message))

    def settled(self, messages: list[AbstractIncomingMessage]) -> None:
        for message in messages:
            channel = _channel_of(message)
            state = None if channel is None else self._channels.get(channel)
            if state is not None:
                state.open.discard(_tag(message))

    def covering(self, messages: list[AbstractIncomingMessage]) -> AbstractIncomingMessage | None:
        """The message whose `multiple` ack settles exactly `messages`, or None."""
        channel = _channel_of(messages[0])
        if len(messages) < 2 or channel is None or any(_channel_of(m) is not channel for m in messages):
            return None
        state = self._channels.get(channel)
        last = max(messages, key=_tag)
        batch = {_tag(message) for message in messages}
        if state is None or _tag(last) > state.seen_through or not batch <= state.open:
            return None
        if any(tag <= _tag(last) and tag not in batch for tag in state.open):
            return None
        return last

    async def ack(self, message: AbstractIncomingMessage) -> None:
        await self._send(message.ack, [message], "ack")

    async def reject(self, message: AbstractIncomingMessage) -> None:
        """To the queue's dead-letter target (`NS.dead`), not back to the queue."""
        await self._send(partial(message.reject, requeue=False), [message], "reject")

    async def ack_batch(self, messages: list[AbstractIncomingMessage]) -> None:
        last = self.covering(messages)
        if last is None:
            for message in messages:
                await self.ack(message)
            return
        await self._send(partial(last.ack, multiple=True), messages, "ack_multiple")

    async def _send(
        self, frame: Callable[[], Awaitable[None]], messages: list[AbstractIncomingMessage], kind: str
    ) -> None:
        try:
            await frame()
        except Exception as exc:  # noqa: BLE001 - the broker redelivers; the copy is a duplicate
            log.warning("ack_failed", frame=kind, messages=len(messages), error=f"{type(exc).__name__}: {exc}")
            return
        self.settled(messages)


def _tag(message: AbstractIncomingMessage) -> int:
    return cast(int, message.delivery_tag)  # None only for a basic.get that found nothing


def _channel_of(message: AbstractIncomingMessage) -> AbstractChannel | None:
    try:
        return message.channel
    except Exception:  # noqa: BLE001 - closed: its deliveries cannot be acked any more
        return None
