"""webhook_ingest.cli: what each of its modules holds.

- main           `webhook-ingest`: every command of docs/reference.md §2.
- common         What every command shares: the environment help and how to fail.
- terminal       What the CLI prints, made safe for the operator's terminal.
- migrate        `webhook-ingest migrate`
- preflight      Before a first run: do RabbitMQ, Redis and Postgres answer, and let us in?
- layout         How many processes `webhook-ingest run` (and `ingress --processes auto`) start by default, chosen …
- ports          The ingress's port, bound before anything starts
- supervisor     `webhook-ingest run`: the ingress and N workers as child processes.
- send_test      `webhook-ingest send-test`: sign a sample event as the provider would, send it.
- dlq            `webhook-ingest dlq …` and `webhook-ingest prune`: on-call's commands (docs/reference.md §2).
- incidents      `webhook-ingest incidents …`: failures grouped into incidents (docs/oncall.md, "Incidents").
- sources        `webhook-ingest sources …`: pause and resume a source (docs/reference.md §8.3).
- events         `webhook-ingest events …`
- events_replay  `webhook-ingest events replay …`
"""

__all__ = ["main"]
