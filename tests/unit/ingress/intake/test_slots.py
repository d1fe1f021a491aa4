"""The bounds on concurrent requests (ingress/intake/slots.py): the process's
slots, and each client's slow bodies."""

from hypothesis import given
from hypothesis import strategies as st

from webhook_ingest.ingress.intake.slots import Slots
from webhook_ingest.ingress.responses import Rejected


@given(
    limit=st.integers(1, 6),
    per_client=st.integers(1, 4),
    steps=st.lists(
        st.tuples(st.sampled_from(["enter", "slow", "arrive", "leave"]), st.sampled_from("abc")), max_size=40
    ),
)
def test_slots_bound_the_process_and_each_clients_slow_bodies(limit, per_client, steps):
    slots, held = Slots(limit, per_client), []  # held: (client, slot, its context, its body slow)
    for action, client in steps:
        mine = [entry for entry in held if entry[0] == client]
        if action == "enter":
            _enter(slots, client, held, limit)
        elif mine and action == "slow" and not mine[0][3]:
            _slow(mine, per_client)
        elif mine and action == "arrive":
            mine[0][1].body_arrived()
            mine[0][3] = False
        elif mine and action == "leave":
            held.remove(mine[0])
            mine[0][2].__exit__(None, None, None)
    for _, _, context, _ in held:
        context.__exit__(None, None, None)
    assert (slots._in_flight, slots._bodies_arriving) == (0, {})  # all given back, no client left behind


def _enter(slots, client, held, limit) -> None:
    """A request of `client` takes a slot: 503 only when the process holds `limit`."""
    context = slots.taken(client)
    try:
        held.append([client, context.__enter__(), context, False])
    except Rejected as refused:
        assert refused.response.status == 503 and len(held) >= limit
    else:
        assert len(held) <= limit


def _slow(mine, per_client) -> None:
    """One of the client's bodies turns slow: 429 only when `per_client` of its bodies are slow already."""
    slow = sum(1 for entry in mine if entry[3])
    try:
        mine[0][1].body_slow()
    except Rejected as refused:
        assert refused.response.status == 429 and slow >= per_client
    else:
        assert slow < per_client
        mine[0][3] = True
