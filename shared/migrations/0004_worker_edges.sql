-- The AMQP message id of the delivery whose run completed the key: a
-- redelivery (its worker died between the commit and the ack) recognises its
-- own completion and is counted as processed, not as a duplicate.
ALTER TABLE processed_events ADD COLUMN message_id text;
