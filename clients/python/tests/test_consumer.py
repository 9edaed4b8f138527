"""The Python client against a real delayd: the binary in DELAYD_BIN, on the
Redis in TEST_REDIS_URL, with auth on (the admin key below), in the
namespace DELAYD_TEST_NAMESPACE (the Go test clients/clients_test.go sets all
three and deletes the namespace's keys afterwards). Run it from
clients/python: python3 -m unittest discover -s tests -v
"""

import os
import re
import subprocess
import sys
import threading
import time
import unittest

import grpc
from google.protobuf import duration_pb2

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from delayd import Consumer, Retry, bearer  # noqa: E402
from delayd.v1 import namespace_pb2, namespace_pb2_grpc, schedule_pb2, schedule_pb2_grpc, task_pb2, task_pb2_grpc  # noqa: E402

ADMIN_KEY = "python-client-test-admin-key-0123456789"


def _drain(stream):
    with stream:
        for _ in stream:
            pass


class Delayd:
    """A delayd process; restart() stops it with SIGTERM and starts it again
    on the same gRPC port, as a rolling restart would."""

    def __init__(self):
        self.listen = "127.0.0.1:0"
        self.proc = None
        self.start()

    def start(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith("DELAYD_")}
        env.update(
            DELAYD_REDIS_URL=os.environ["TEST_REDIS_URL"],
            DELAYD_ADMIN_KEY=ADMIN_KEY,
            DELAYD_LISTEN=self.listen,
            DELAYD_HTTP_LISTEN="",
            DELAYD_OPS_LISTEN="",
        )
        self.proc = subprocess.Popen([os.environ["DELAYD_BIN"]], env=env, stderr=subprocess.PIPE, text=True)
        seen = []
        for line in self.proc.stderr:
            seen.append(line)
            m = re.search(r'msg="delayd serving" addr=(\S+)', line)
            if m:
                self.listen = m.group(1)
                break
        else:
            raise RuntimeError("delayd exited before serving:\n" + "".join(seen[-5:]))
        # Keep reading its log, or delayd blocks on a full pipe.
        threading.Thread(target=_drain, args=(self.proc.stderr,), daemon=True).start()

    def stop(self):
        self.proc.terminate()
        self.assert_exit = self.proc.wait(timeout=30)

    def restart(self):
        self.stop()
        self.start()


class ConsumerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ns = os.environ["DELAYD_TEST_NAMESPACE"]
        cls.delayd = Delayd()
        cls.channel = grpc.insecure_channel(cls.delayd.listen)
        cls.tasks = task_pb2_grpc.TaskServiceStub(cls.channel)
        admin = namespace_pb2_grpc.NamespaceServiceStub(cls.channel)
        # A short lease, so that a handler slower than it shows the
        # consumer's lease extension.
        admin.CreateNamespace(
            namespace_pb2.CreateNamespaceRequest(
                namespace=namespace_pb2.Namespace(
                    name=cls.ns,
                    policy=namespace_pb2.NamespacePolicy(ack_timeout=duration_pb2.Duration(seconds=3), max_attempts=5),
                )
            ),
            metadata=bearer(ADMIN_KEY),
            timeout=10,
        )

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.delayd.stop()

    def upsert(self, task_id, payload=b"", delay_ms=0):
        self.tasks.UpsertTask(
            task_pb2.UpsertTaskRequest(
                namespace=self.ns, id=task_id, payload=payload, delay=duration_pb2.Duration(nanos=delay_ms * 1_000_000)
            ),
            metadata=bearer(ADMIN_KEY),
            timeout=10,
            wait_for_ready=True,  # the channel may still be reconnecting after a restart
        )

    def gone(self, task_id):
        try:
            self.tasks.GetTask(task_pb2.GetTaskRequest(namespace=self.ns, id=task_id), metadata=bearer(ADMIN_KEY), timeout=10, wait_for_ready=True)
        except grpc.RpcError as err:
            return err.code() == grpc.StatusCode.NOT_FOUND
        return False

    def wait_for(self, what, cond, within=30):
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if cond():
                return
            time.sleep(0.05)
        self.fail("timed out waiting for " + what)

    def test_ack_nack_extend_and_reconnect(self):
        seen = {}  # task id -> attempts seen, in order
        lock = threading.Lock()

        def handle(msg):
            with lock:
                seen.setdefault(msg.id, []).append(msg.attempt)
            if msg.id == "nack-once" and msg.attempt == 1:
                raise Retry(after=0.2, reason="not yet")
            if msg.id == "fails-once" and msg.attempt == 1:
                raise ValueError("boom")
            if msg.id == "slow":
                time.sleep(7)  # over twice the 3 s lease: only extension keeps it
            if msg.id == "last":
                time.sleep(1)  # still running when stop() is called

        # extend_by 3 s: the consumer extends whenever under 1.5 s is left.
        consumer = Consumer(self.channel, self.ns, handle, api_key=ADMIN_KEY, extend_by=3.0, backoff=(0.05, 0.5))
        runner = threading.Thread(target=consumer.run)
        runner.start()
        try:
            for i in range(10):
                self.upsert(f"t{i}", payload=b"p%d" % i)
            self.upsert("nack-once")
            self.upsert("fails-once")
            self.upsert("slow")
            ids = [f"t{i}" for i in range(10)] + ["nack-once", "fails-once", "slow"]
            self.wait_for("every task acked", lambda: all(self.gone(i) for i in ids))
            with lock:
                for i in range(10):
                    self.assertEqual(seen[f"t{i}"], [1], f"t{i}")
                self.assertEqual(seen["nack-once"], [1, 2])
                self.assertEqual(seen["fails-once"], [1, 2])
                self.assertEqual(seen["slow"], [1], f"the slow task was redelivered: its lease was not extended in time ({consumer.stats})")
            self.assertGreaterEqual(consumer.stats["extended"], 2)
            self.assertEqual(consumer.stats["nacked"], 2)

            # delayd restarts (SIGTERM, then a new process on the same port):
            # the stream breaks, the consumer reconnects and goes on.
            self.delayd.restart()
            self.assertEqual(self.delayd.assert_exit, 0, "delayd did not exit 0 on SIGTERM")
            self.upsert("after-restart", delay_ms=100)
            self.wait_for("the task upserted after the restart acked", lambda: self.gone("after-restart"))
            self.assertGreaterEqual(consumer.stats["reconnects"], 1)
            with lock:
                self.assertEqual(seen["after-restart"], [1])

            # stop() while a handler runs: it finishes, its ack is answered,
            # and only then does the stream close.
            self.upsert("last")
            self.wait_for("the last task's handler to start", lambda: "last" in seen)
            consumer.stop()
            runner.join(timeout=30)
            self.assertFalse(runner.is_alive(), "run() did not return after stop()")
            self.assertTrue(self.gone("last"), "the task handled while stopping was not acked before the stream closed")
        finally:
            consumer.stop()
            runner.join(timeout=30)

    def test_schedule_fires_tasks(self):
        # A schedule every second: each slot becomes a task (id: the
        # schedule's id and the slot), received by an ordinary consumer.
        schedules = schedule_pb2_grpc.ScheduleServiceStub(self.channel)
        created = schedules.CreateSchedule(
            schedule_pb2.CreateScheduleRequest(
                schedule=schedule_pb2.Schedule(
                    namespace=self.ns,
                    id="py-tick",
                    every=duration_pb2.Duration(seconds=1),
                    task=schedule_pb2.ScheduleTaskTemplate(kind="report.tick", payload=b"{}"),
                )
            ),
            metadata=bearer(ADMIN_KEY),
            timeout=10,
        ).schedule
        self.assertEqual(created.state, schedule_pb2.SCHEDULE_STATE_ACTIVE)
        preview = schedules.PreviewSchedule(
            schedule_pb2.PreviewScheduleRequest(namespace=self.ns, id="py-tick", count=3), metadata=bearer(ADMIN_KEY), timeout=10
        )
        self.assertEqual(len(preview.firings), 3)
        self.assertTrue(preview.firings[0].task_id.startswith("py-tick."), preview.firings[0].task_id)

        fired = []

        def handle(msg):
            if msg.id.startswith("py-tick."):
                fired.append((msg.id, msg.task.kind))

        consumer = Consumer(self.channel, self.ns, handle, api_key=ADMIN_KEY)
        runner = threading.Thread(target=consumer.run)
        runner.start()
        try:
            self.wait_for("two firings", lambda: len(fired) >= 2)
        finally:
            consumer.stop()
            runner.join(timeout=30)
        ids = sorted(i for i, _ in fired)
        self.assertEqual(len(set(ids)), len(ids), f"a slot fired twice: {ids}")
        self.assertRegex(ids[0], r"^py-tick\.\d{8}T\d{6}Z$")
        self.assertEqual(fired[0][1], "report.tick")
        deleted = schedules.DeleteSchedule(
            schedule_pb2.DeleteScheduleRequest(namespace=self.ns, id="py-tick"), metadata=bearer(ADMIN_KEY), timeout=10
        )
        self.assertGreater(deleted.removed_firings, 0)

    def test_bad_key_is_raised_not_retried(self):
        consumer = Consumer(self.channel, self.ns, lambda m: None, api_key="not-a-key-of-this-delayd-0000")
        with self.assertRaises(grpc.RpcError) as ctx:
            consumer.run()
        self.assertEqual(ctx.exception.code(), grpc.StatusCode.UNAUTHENTICATED)


if __name__ == "__main__":
    unittest.main()
