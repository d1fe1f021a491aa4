-- The ingress's outbox (docs/reference.md §6, "When RabbitMQ is away"): an event the
-- broker did not confirm, stored in one committed insert and answered 200;
-- the relay in every ingress process publishes the rows oldest first and
-- deletes each one only after its publisher confirm.
--
-- `body` and `amqp_headers` are exactly the message the ingress would have
-- published (the raw request body, and the AMQP header table in its wire
-- encoding: event id, key, payload hash, provider headers, receive time).
-- Bytes, not jsonb: a provider header need not be UTF-8, and jsonb refuses
-- some JSON a provider may send. The other columns repeat what an operator
-- reads (`SELECT key, stored_at FROM outbox`) and what the gauges need.
CREATE TABLE outbox (
    id              bigserial PRIMARY KEY,
    key             text NOT NULL,
    source          text NOT NULL,
    event_id        text NOT NULL,
    payload_sha256  text NOT NULL,
    body            bytea NOT NULL,
    amqp_headers    bytea NOT NULL,
    stored_at       timestamptz NOT NULL DEFAULT clock_timestamp()
);
