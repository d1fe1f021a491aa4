"""A randomized, seeded fault run (`make chaos`, issue 10): thousands of
events with copies through a real ingress to three workers in mixed modes,
while a schedule drawn from the seed kills workers, cuts their Redis,
Postgres and RabbitMQ connections, flushes Redis and prunes; then every
accepted event is checked against docs/reference.md §6–§8. See docs/operations.md.
"""
