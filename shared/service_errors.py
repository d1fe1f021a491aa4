"""What a backing service that cannot be reached raises, per client library.

A caller catches these to tell "the service is away" (wait, answer 503, say
so in one line) from a bug in our own code, which should still crash loudly.
The workers' narrower test of an outage *during* a handler is
`workers/failures/outage.py`.
"""

import asyncio

import aio_pika
import aiormq
import asyncpg
import redis.asyncio as redis

POSTGRES_ERRORS = (OSError, asyncio.TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError)
REDIS_ERRORS = (redis.RedisError, OSError, asyncio.TimeoutError)
BROKER_ERRORS = (
    aio_pika.exceptions.AMQPError,
    aiormq.exceptions.AMQPError,
    OSError,
    asyncio.TimeoutError,
    RuntimeError,  # aio-pika raises it for a channel closed while reconnecting
)
