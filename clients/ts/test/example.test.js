// Runs the example against a real delayd: the binary in DELAYD_BIN (make
// test builds it), started in embedded mode on free loopback ports.
import { test, before, after } from "node:test";
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { fileURLToPath } from "node:url";
import assert from "node:assert/strict";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { TaskService } from "../src/gen/delayd/v1/task_pb.js";
import { TaskState } from "../src/gen/delayd/v1/task_pb.js";
import { NamespaceService } from "../src/gen/delayd/v1/namespace_pb.js";
import { TokenStatus } from "../src/gen/delayd/v1/delivery_pb.js";
import { upsertAndSubscribe } from "../example/upsert-and-subscribe.js";
import { streamDeliveries } from "../example/stream-deliveries.js";
import { scheduleAndReceive } from "../example/schedule.js";
import { ScheduleState } from "../src/gen/delayd/v1/schedule_pb.js";
import { startDelayd } from "./delayd.js";

const execFileP = promisify(execFile);

let delayd;
let baseUrl;

before(async () => {
  delayd = await startDelayd();
  baseUrl = delayd.baseUrl;
});

after(() => {
  delayd?.stop();
});

test("the example upserts a task and receives it on its first attempt", async () => {
  const out = await upsertAndSubscribe({ baseUrl, namespace: "ts-example", id: "hello-1", delaySeconds: 0 });
  assert.equal(out.created, true);
  assert.equal(out.generation, 1n);
  assert.equal(out.delivered, "hello-1");
  assert.equal(out.attempt, 1);
  assert.equal(out.payload, JSON.stringify({ hello: "hello-1" }));
  assert.equal(out.ack, TokenStatus.OK);

  // Acked: the task is gone, and the error carries delayd's code and message.
  const tasks = createClient(TaskService, createConnectTransport({ baseUrl, httpVersion: "1.1" }));
  await assert.rejects(tasks.getTask({ namespace: "ts-example", id: "hello-1" }), (err) => {
    assert.ok(err instanceof ConnectError);
    assert.equal(err.code, Code.NotFound);
    assert.match(err.rawMessage, /task "hello-1" not found/);
    return true;
  });
});

test("the examples, run as programs in a namespace with another consumer's task, touch only their own", async () => {
  // Someone else's task, due now, in a namespace that gives each task one
  // attempt: a delivery of it to an example would lease it for the ack
  // timeout and then make it a dead letter.
  const transport = createConnectTransport({ baseUrl, httpVersion: "1.1" });
  const tasks = createClient(TaskService, transport);
  await createClient(NamespaceService, transport).createNamespace({ namespace: { name: "ts-twice", policy: { maxAttempts: 1 } } });
  await tasks.upsertTask({ namespace: "ts-twice", id: "not-yours", kind: "order.close", when: { case: "delay", value: { seconds: 0n } } });
  const example = (name) => fileURLToPath(new URL(`../example/${name}`, import.meta.url));
  for (const run of [1, 2]) {
    const { stdout } = await execFileP(process.execPath, [example("upsert-and-subscribe.js"), baseUrl, "ts-twice"]);
    assert.match(stdout, /delivered: 'hello-\d+'/, `run ${run} printed:\n${stdout}`);
    assert.match(stdout, /ack: 1/, `run ${run} printed:\n${stdout}`);
  }
  const { stdout: streamed } = await execFileP(process.execPath, [example("stream-deliveries.js"), baseUrl, "ts-twice", "5"]);
  assert.match(streamed, /acked: 5/, `stream-deliveries printed:\n${streamed}`);
  // The other task was never delivered: still scheduled, no attempt spent.
  const other = await tasks.getTask({ namespace: "ts-twice", id: "not-yours" });
  assert.equal(other.task.state, TaskState.SCHEDULED, `the other consumer's task is ${TaskState[other.task.state]}`);
  assert.equal(other.task.attempt, 0);
  // And with no namespace named, each run picks a scratch one of its own.
  const { stdout } = await execFileP(process.execPath, [fileURLToPath(new URL("../example/upsert-and-subscribe.js", import.meta.url)), baseUrl]);
  assert.match(stdout, /ack: 1/);
});

test("a bad request is InvalidArgument naming the field", async () => {
  const tasks = createClient(TaskService, createConnectTransport({ baseUrl, httpVersion: "1.1" }));
  await assert.rejects(
    tasks.upsertTask({ namespace: "ts-example", id: "bad/id", when: { case: "delay", value: { seconds: 1n } } }),
    (err) => err instanceof ConnectError && err.code === Code.InvalidArgument && /id has '\/'/.test(err.rawMessage),
  );
  const listed = await tasks.listTasks({ namespace: "ts-example", state: TaskState.SCHEDULED });
  assert.deepEqual(listed.tasks, []);
});

test("StreamDeliveries over HTTP/2 brings several deliveries per message and takes the acks on the stream", async () => {
  const out = await streamDeliveries({ baseUrl, namespace: "ts-stream", count: 20 });
  assert.equal(out.delivered.length, 20);
  assert.equal(new Set(out.delivered).size, 20);
  assert.ok(out.messages < 20, `20 deliveries came in ${out.messages} messages; want several per message`);
  assert.equal(out.acked, 20);

  // Acked on the stream: nothing is left.
  const tasks = createClient(TaskService, createConnectTransport({ baseUrl, httpVersion: "1.1" }));
  const listed = await tasks.listTasks({ namespace: "ts-stream" });
  assert.deepEqual(listed.tasks, []);
});

test("the schedule example receives its first firing as a task named by schedule and slot", async () => {
  const out = await scheduleAndReceive({ baseUrl, namespace: "ts-schedule", id: "tick" });
  assert.equal(out.state, ScheduleState.ACTIVE);
  assert.equal(out.nextSlots.length, 3);
  assert.match(out.nextSlots[0], /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ UTC$/);
  assert.match(out.firing.id, /^tick\.\d{8}T\d{6}Z$/);
  assert.equal(out.firing.kind, "example.tick");
  assert.equal(out.firing.dueTime.getMilliseconds(), 0);
  assert.ok(out.removedFirings > 0, `deleting a 1 s schedule removes the firings of its lookahead, got ${out.removedFirings}`);
});
