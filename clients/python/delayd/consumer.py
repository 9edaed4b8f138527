"""A delayd consumer loop over DeliveryService.StreamDeliveries.

    import grpc
    from delayd import Consumer, Retry

    def handle(msg):
        if not ready(msg.payload):
            raise Retry(after=30, reason="not ready")  # nack: again in 30 s
        do_work(msg.payload)                            # return: ack

    channel = grpc.insecure_channel("localhost:7070")
    consumer = Consumer(channel, "orders", handle, api_key=KEY)
    consumer.run()          # until consumer.stop(), e.g. from a SIGTERM handler

One bidirectional stream brings deliveries (several per message, at most
max_in_flight unacked at once) and takes the verdicts back: a handler that
returns acks its delivery, one that raises Retry nacks it with that delay,
one that raises anything else nacks it with the namespace's backoff and the
exception as the reason. While a handler runs, the consumer extends its
lease before the deadline (extend_by at a time), so a slow handler is not
redelivered to someone else. When the stream breaks (a delayd restart, a
network cut) the consumer reconnects with exponential backoff; deliveries
the broken stream held go back to delayd's queue and come again, so a
handler must be idempotent (delivery is at-least-once).
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import grpc
from google.protobuf import duration_pb2

from delayd.v1 import delivery_pb2, delivery_pb2_grpc

__all__ = ["Consumer", "Message", "Retry", "bearer"]

log = logging.getLogger("delayd.consumer")

# Codes a retry cannot fix: the consumer stops and raises.
_FATAL = frozenset(
    {
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)

_MAX_TOKENS = 1000  # per StreamDeliveries request, across acks, nacks, extends


def bearer(api_key: str) -> List[Tuple[str, str]]:
    """The call metadata that authenticates with a delayd API key."""
    return [("authorization", "Bearer " + api_key)]


class Retry(Exception):
    """Raised by a handler to nack its delivery: delayd delivers the task
    again after `after` seconds (None: the namespace's backoff for the
    attempt). The reason is kept on the task (last_error)."""

    def __init__(self, after: Optional[float] = None, reason: str = ""):
        super().__init__(reason)
        self.after = after
        self.reason = reason


class Message:
    """One delivery as a handler sees it."""

    def __init__(self, delivery: delivery_pb2.Delivery, consumer: "Consumer"):
        self.delivery = delivery
        self._consumer = consumer
        self._deadline = delivery.lease_deadline.ToNanoseconds() / 1e9
        self._extending = False

    @property
    def task(self):
        """The delayd.v1.Task: id, kind, payload, attempt, due_time, ..."""
        return self.delivery.task

    @property
    def id(self) -> str:
        return self.delivery.task.id

    @property
    def payload(self) -> bytes:
        return self.delivery.task.payload

    @property
    def attempt(self) -> int:
        return self.delivery.task.attempt

    @property
    def token(self) -> str:
        return self.delivery.token

    @property
    def lease_deadline(self) -> float:
        """When the lease ends, in seconds since the epoch (delayd's clock)."""
        return self._deadline

    def extend_lease(self, seconds: float) -> None:
        """Ask for the lease to end `seconds` from now (it never moves
        earlier). The consumer does this by itself while the handler runs;
        call it for a longer step than extend_by covers."""
        self._consumer._send(extends=[(self.token, seconds)])


Handler = Callable[[Message], None]


class Consumer:
    """Receives a namespace's due tasks and runs handler on each, in a pool
    of `workers` threads. See the module's doc for the verdicts."""

    def __init__(
        self,
        channel: grpc.Channel,
        namespace: str,
        handler: Handler,
        *,
        api_key: Optional[str] = None,
        max_in_flight: int = 64,
        max_batch: int = 100,
        kinds: Sequence[str] = (),
        workers: int = 8,
        extend_by: float = 30.0,
        backoff: Tuple[float, float] = (0.1, 5.0),
    ):
        self._stub = delivery_pb2_grpc.DeliveryServiceStub(channel)
        self._namespace = namespace
        self._handler = handler
        self._metadata = bearer(api_key) if api_key else None
        self._max_in_flight = max_in_flight
        self._max_batch = max_batch
        self._kinds = list(kinds)
        self._workers = workers
        self._extend_by = extend_by
        self._backoff = backoff
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._out: Optional[queue.Queue] = None  # the open stream's requests
        self._call = None
        self._held: Dict[str, Message] = {}  # token -> message, while handled
        # Counts, for logs and tests: acked, nacked and extended are OK
        # answers from delayd; rejected counts other answers (STALE: the
        # delivery was already taken back); reconnects counts new streams
        # after a broken one.
        self.stats = {"delivered": 0, "acked": 0, "nacked": 0, "extended": 0, "rejected": 0, "reconnects": 0}
        self._sent = 0  # ack and nack tokens sent on the open stream
        self._answered = 0  # and answered on it

    def stop(self, drain: float = 10.0) -> None:
        """Ends run() gracefully, without blocking (a signal handler may call
        it): deliveries that arrive from now on are handed back at once,
        running handlers get up to `drain` seconds to finish and have their
        verdicts answered, then the stream is closed (what it still holds
        goes back to delayd's queue) and run() returns."""
        if self._stop.is_set():
            return
        self._stop.set()
        threading.Thread(target=self._drain_then_close, args=(drain,), name="delayd-drain", daemon=True).start()

    def _drain_then_close(self, drain: float) -> None:
        deadline = time.monotonic() + drain
        while time.monotonic() < deadline:
            with self._lock:
                if self._call is None or (not self._held and self._answered >= self._sent):
                    break
            time.sleep(0.02)
        with self._lock:
            if self._call is not None:
                self._call.cancel()

    def run(self) -> None:
        """Consumes until stop(); reconnects after a broken stream. Raises
        grpc.RpcError when delayd refuses the stream for good (a bad key or
        namespace: UNAUTHENTICATED, PERMISSION_DENIED, INVALID_ARGUMENT,
        NOT_FOUND)."""
        pool = ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix="delayd-handler")
        delay = self._backoff[0]
        first = True
        try:
            while not self._stop.is_set():
                if not first:
                    self._bump("reconnects")
                first = False
                try:
                    if self._stream(pool):
                        delay = self._backoff[0]  # it delivered: start over
                except grpc.RpcError as err:
                    if self._stop.is_set():
                        break
                    if err.code() in _FATAL:
                        raise
                    log.warning("delayd stream broke (%s: %s); reconnecting in %.1fs", err.code().name, err.details(), delay)
                # Full jitter, so a fleet of consumers does not reconnect at once.
                self._stop.wait(random.uniform(delay / 2, delay))
                delay = min(delay * 2, self._backoff[1])
        finally:
            pool.shutdown(wait=True)

    def _stream(self, pool: ThreadPoolExecutor) -> bool:
        out: queue.Queue = queue.Queue()
        opening = delivery_pb2.StreamDeliveriesRequest(
            namespace=self._namespace,
            max_in_flight=self._max_in_flight,
            max_batch=self._max_batch,
            kinds=self._kinds,
        )
        call = self._stub.StreamDeliveries(self._requests(opening, out), metadata=self._metadata, wait_for_ready=True)
        with self._lock:
            if self._stop.is_set():
                call.cancel()
            self._out, self._call = out, call
            self._sent = self._answered = 0
        delivered = False
        try:
            for resp in call:
                for d in resp.deliveries:
                    delivered = True
                    self._bump("delivered")
                    if self._stop.is_set():  # stopping: give it back at once
                        self._send(nacks=[(d.token, 0, "consumer stopping")])
                        continue
                    msg = Message(d, self)
                    with self._lock:
                        self._held[d.token] = msg
                    pool.submit(self._handle, msg)
                self._results(resp)
        finally:
            out.put(None)  # ends the request iterator
            with self._lock:
                self._out, self._call = None, None
                self._held.clear()  # delayd took them back with the stream
        return delivered

    def _requests(self, opening, out: queue.Queue) -> Iterator[delivery_pb2.StreamDeliveriesRequest]:
        yield opening
        while True:
            ext = self._due_extensions()
            if ext is not None:
                yield ext
            try:
                item = out.get(timeout=0.25)
            except queue.Empty:
                continue
            if item is None:
                return
            # Join what else is waiting into one request, up to the token cap.
            n = _tokens(item)
            while n < _MAX_TOKENS:
                try:
                    more = out.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    yield item
                    return
                item.MergeFrom(more)
                n += _tokens(more)
            yield item

    def _due_extensions(self) -> Optional[delivery_pb2.StreamDeliveriesRequest]:
        """Extensions for the leases of running handlers that end within
        half of extend_by."""
        now = time.time()
        due = []
        with self._lock:
            for msg in self._held.values():
                if not msg._extending and msg._deadline - now < self._extend_by / 2:
                    msg._extending = True
                    due.append(msg.token)
        if not due:
            return None
        return delivery_pb2.StreamDeliveriesRequest(
            extends=[delivery_pb2.StreamExtend(tokens=due, extend_by=_duration(self._extend_by))]
        )

    def _handle(self, msg: Message) -> None:
        try:
            self._handler(msg)
        except Retry as r:
            self._send(nacks=[(msg.token, r.after, r.reason)])
        except Exception as exc:  # the handler's failure is the task's
            log.warning("handler failed on task %s (attempt %d): %r", msg.id, msg.attempt, exc)
            self._send(nacks=[(msg.token, None, repr(exc)[:500])])
        else:
            self._send(acks=[msg.token])
        finally:
            with self._lock:
                self._held.pop(msg.token, None)

    def _send(self, acks=(), nacks=(), extends=()) -> None:
        req = delivery_pb2.StreamDeliveriesRequest(ack_tokens=list(acks))
        for token, after, reason in nacks:
            n = req.nacks.add(tokens=[token], reason=reason)
            if after is not None:
                n.retry_after.CopyFrom(_duration(after))
        for token, seconds in extends:
            req.extends.add(tokens=[token], extend_by=_duration(seconds))
        with self._lock:
            out = self._out
            if out is not None:
                self._sent += len(req.ack_tokens) + len(req.nacks)
        if out is None:
            # No stream: delayd took the delivery back when the last one
            # broke and delivers it again; this verdict has nothing to name.
            log.info("no stream for a verdict; delayd redelivers the task")
            return
        out.put(req)

    def _results(self, resp: delivery_pb2.StreamDeliveriesResponse) -> None:
        ok = delivery_pb2.TOKEN_STATUS_OK
        with self._lock:
            self._answered += len(resp.ack_results) + len(resp.nack_results)
        for name, results in (("acked", resp.ack_results), ("nacked", resp.nack_results), ("extended", resp.extend_results)):
            for r in results:
                self._bump(name if r.status == ok else "rejected")
        for r in resp.extend_results:
            with self._lock:
                msg = self._held.get(r.token)
                if msg is not None:
                    msg._extending = False
                    if r.status == ok:
                        msg._deadline = r.lease_deadline.ToNanoseconds() / 1e9

    def _bump(self, name: str) -> None:
        with self._lock:
            self.stats[name] += 1


def _tokens(req: delivery_pb2.StreamDeliveriesRequest) -> int:
    return len(req.ack_tokens) + sum(len(n.tokens) for n in req.nacks) + sum(len(e.tokens) for e in req.extends)


def _duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d
