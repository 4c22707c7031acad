"""Publishing after commit that survives a broker outage: publisher confirms, and
what the broker did not confirm held in the process and published again every
second until it does (docs/architecture.md, "Publishing through a broker outage").

Every message BatchGen publishes after a commit (validate, chunk, finalize, webhook
send, recover) goes through `publish`. The broker confirms each one (RabbitMQ's
publisher confirms, `confirm_publish` in CELERY_BROKER_TRANSPORT_OPTIONS; a Redis
LPUSH is answered by its reply), so a message written into a connection the broker
has already dropped is seen as not taken instead of being lost without a word.
What is not taken waits in this process's queue; one thread per process publishes
it again every RETRY_SECONDS, and the callers never wait for a broker that is down
(once something is held, later messages queue behind it at once).

Every task BatchGen publishes tolerates a duplicate (a claim, a finalize, a
validation admission and a webhook claim are conditional updates), so a message
the broker took but whose confirm was lost with the connection may go twice:
never zero times while this process lives. Messages held by a process that dies
are left to recovery (batches/recovery.py), as before.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from core.celery import app

logger = logging.getLogger("batchgen.broker")

# How often held messages are tried again: a batch created during an outage is
# validated within about this long of the broker's return (issue 26: within 10 s).
RETRY_SECONDS = 1.0
# How long one publish waits for the broker's confirm before it counts as not taken.
CONFIRM_TIMEOUT = 5.0
# One try: Celery's publish retry, short (the held queue is the retry that lasts).
RETRY_POLICY = {"max_retries": 1, "interval_start": 0, "interval_step": 0.2,
                "interval_max": 0.2}


@dataclass
class Message:
    name: str
    args: tuple = ()
    options: dict = field(default_factory=dict)
    # Run in the retry thread once the broker took a held message (mark a chunk
    # published); what `publish` sends at once its caller accounts for itself.
    after: Callable[[], None] | None = None


class Publisher:
    def __init__(self) -> None:
        self._held: collections.deque[Message] = collections.deque()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._down_since = 0.0

    @property
    def held(self) -> int:
        return len(self._held)

    def publish(self, message: Message, *, producer=None) -> bool:
        """Publish now, or hold the message to publish once the broker takes it.
        Returns whether the broker took it now. Never raises for a broker fault."""
        if self._held:
            self._hold([message], None)  # behind what waits already, without waiting
            return False
        try:
            self._send(message, producer)
        except Exception as exc:  # any broker fault: the message must not be lost
            self._hold([message], exc)
            return False
        return True

    def publish_all(self, messages: list[Message]) -> int:
        """Publish in order on one producer; what the broker does not take, from the
        first refusal on, is held. Returns how many it took now."""
        if self._held:
            self._hold(messages, None)
            return 0
        done = 0
        try:
            with app.producer_or_acquire() as producer:
                for message in messages:
                    self._send(message, producer)
                    done += 1
        except Exception as exc:
            self._hold(messages[done:], exc)
        return done

    def _send(self, message: Message, producer) -> None:
        app.send_task(message.name, args=message.args, producer=producer,
                      retry_policy=RETRY_POLICY, confirm_timeout=CONFIRM_TIMEOUT,
                      **message.options)

    def _hold(self, messages: list[Message], exc: Exception | None) -> None:
        if not messages:
            return
        with self._lock:
            first = not self._held
            self._held.extend(messages)
            if first:
                self._down_since = time.monotonic()
                logger.warning("the broker did not take a message (%s); holding what is "
                               "published until it does, trying every %.0f s",
                               exc or "broker down", RETRY_SECONDS)
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                # Per process: a forked child has the deque but not the thread.
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._retry_forever, daemon=True,
                                                name="publish-retry")
                self._thread.start()

    def _retry_forever(self) -> None:
        from django.db import connection

        while True:
            time.sleep(RETRY_SECONDS)
            if self._held and self.retry_held():
                connection.close()  # this thread's own, opened by `after`; it idles long

    def retry_held(self) -> int:
        """Publish what is held, in order, until the broker refuses one; returns how
        many it took."""
        done = 0
        while self._held:
            message = self._held[0]
            try:
                self._send(message, None)
            except Exception:
                return done  # still down: the next turn tries again
            with self._lock:
                self._held.popleft()
                done += 1
                if not self._held:
                    logger.info("the broker is back: published the messages held for "
                                "%.1f s", time.monotonic() - self._down_since)
            if message.after is not None:
                _run_after(message)
        return done


def _run_after(message: Message) -> None:
    try:
        message.after()
    except Exception as exc:
        # Bookkeeping only (recovery publishes such a chunk once more, harmlessly):
        # the message itself went out.
        logger.warning("published %s, but its bookkeeping failed: %s", message.name, exc)


publisher = Publisher()


def publish(name: str, args: tuple = (), **options) -> bool:
    """Publish a task by name after a commit; see the module's docstring."""
    return publisher.publish(Message(name, tuple(args), options))
