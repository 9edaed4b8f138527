// The Publisher against a real delayd: every answer an upsert or a remove
// can get is the same batched as alone, and calls for one id keep their order.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { TaskSchema, TaskService } from "../src/gen/delayd/v1/task_pb.js";
import { Publisher } from "../src/publisher.js";
import { startDelayd } from "./delayd.js";

let delayd;
let tasks;
let batchSizes;
let removeCalls;

before(async () => {
  delayd = await startDelayd();
  batchSizes = [];
  removeCalls = [];
  const count = (next) => async (req) => {
    if (req.method.name === "BatchUpsertTasks") batchSizes.push(req.message.tasks.length);
    if (req.method.name === "RemoveTasks") removeCalls.push(req.message.ids.length);
    if (req.method.name === "RemoveTask") removeCalls.push("one");
    return next(req);
  };
  tasks = createClient(TaskService, createConnectTransport({ baseUrl: delayd.baseUrl, httpVersion: "1.1", interceptors: [count] }));
});

after(() => delayd?.stop());

const hour = { case: "delay", value: { seconds: 3600n } };
const cases = [
  { name: "create", req: { id: "new-1", kind: "k", when: hour } },
  { name: "replace", req: { id: "seed-replace", when: hour } },
  { name: "id with slash", req: { id: "bad/id", when: hour } },
  { name: "empty id", req: { id: "", when: hour } },
  { name: "no due time", req: { id: "nowhen-1" } },
  { name: "payload over the limit", req: { id: "big-1", payload: new Uint8Array(64 * 1024 + 1), when: hour } },
  { name: "create-only, exists", req: { id: "seed-dup", when: hour, createOnly: true } },
  { name: "if-generation, other", req: { id: "seed-cas", when: hour, ifGeneration: 5n } },
  { name: "if-generation, no task", req: { id: "missing-1", when: hour, ifGeneration: 1n } },
  { name: "create-only with if-generation", req: { id: "both-1", when: hour, createOnly: true, ifGeneration: 1n } },
];

async function seed(ns) {
  for (const id of ["seed-replace", "seed-dup", "seed-cas"]) {
    await tasks.upsertTask({ namespace: ns, id, when: hour });
  }
}

// What a caller can tell about an answer; incarnations differ per namespace.
function view(ns, p) {
  return p.then(
    (r) => ({ created: r.created, generation: r.task.generation }),
    (e) => {
      assert.ok(e instanceof ConnectError, String(e));
      const task = e.findDetails(TaskSchema)[0];
      return {
        code: e.code,
        message: e.rawMessage.replaceAll(ns, "NS").replace(/\d{6,}/g, "N"),
        details: e.details.map((d) => d.type ?? d.desc?.typeName),
        task: task && { id: task.id, generation: task.generation },
      };
    },
  );
}

test("a batched upsert answers as a lone UpsertTask", async () => {
  const nsU = `ts-pub-u-${process.pid}`;
  const nsB = `ts-pub-b-${process.pid}`;
  await seed(nsU);
  await seed(nsB);
  const want = [];
  for (const c of cases) want.push(await view(nsU, tasks.upsertTask({ ...c.req, namespace: nsU })));

  // A batch leaves only when it holds every case.
  const pub = new Publisher(tasks, { lingerMs: 3_600_000, maxCount: cases.length });
  batchSizes.length = 0;
  const got = await Promise.all(cases.map((c) => view(nsB, pub.upsertTask({ ...c.req, namespace: nsB }))));
  assert.deepEqual(batchSizes, [cases.length]);
  cases.forEach((c, i) => assert.deepEqual(got[i], want[i], c.name));
  assert.ok(want.some((w) => w.details?.includes("google.rpc.ErrorInfo")), "no case carried ErrorInfo");
});

test("calls for one id keep their order; a lone call waits for nothing; close flushes", async () => {
  const ns = `ts-pub-o-${process.pid}`;
  const pub = new Publisher(tasks, { lingerMs: 3_600_000 });
  const calls = [];
  for (let r = 0; r < 20; r++) {
    for (const id of ["a", "b", "c"]) {
      calls.push(pub.upsertTask({ namespace: ns, id, payload: new TextEncoder().encode(String(r)), when: hour }));
    }
  }
  calls.push(pub.removeTask({ namespace: ns, id: "b" }));
  await pub.close(); // the linger would hold them for an hour
  await Promise.all(calls);
  for (const id of ["a", "c"]) {
    const { task } = await tasks.getTask({ namespace: ns, id });
    assert.equal(new TextDecoder().decode(task.payload), "19", id);
    assert.equal(task.generation, 20n, id);
  }
  await assert.rejects(tasks.getTask({ namespace: ns, id: "b" }));
  await assert.rejects(pub.upsertTask({ namespace: ns, id: "late", when: hour }), /closed/);

  batchSizes.length = 0;
  const lone = new Publisher(tasks);
  const r = await lone.upsertTask({ namespace: ns, id: "lone", when: hour });
  assert.equal(r.created, true);
  assert.deepEqual(batchSizes, [], "a lone call went as a batch");
});

test("a batched remove answers as a lone RemoveTask", async () => {
  const nsU = `ts-pub-ru-${process.pid}`;
  const nsB = `ts-pub-rb-${process.pid}`;
  const valid = ["seed-replace", "missing-1", "seed-dup", "missing-2"];
  const invalid = ["seed-cas", "bad/id", "missing-3"];
  const answer = (p) => p.then(
    (r) => ({ removed: r.removed, previousState: r.previousState }),
    (e) => ({ code: e.code, message: e.rawMessage }),
  );
  await seed(nsU);
  await seed(nsB);
  const want = [];
  for (const id of [...valid, ...invalid]) want.push(await answer(tasks.removeTask({ namespace: nsU, id })));

  const pub = new Publisher(tasks, { lingerMs: 3_600_000, maxCount: 4 });
  removeCalls.length = 0;
  const got = await Promise.all(valid.map((id) => answer(pub.removeTask({ namespace: nsB, id }))));
  assert.deepEqual(removeCalls, [valid.length], "the removes did not go as one RemoveTasks");
  removeCalls.length = 0;
  const p = invalid.map((id) => answer(pub.removeTask({ namespace: nsB, id })));
  await pub.flush();
  got.push(...await Promise.all(p));
  // refused as a whole for the malformed id, then each sent alone
  assert.deepEqual(removeCalls, [invalid.length, "one", "one", "one"]);
  assert.deepEqual(got, want);
  assert.equal(want[0].removed, true);
  assert.equal(want[1].removed, false);
  assert.ok(want[5].code !== undefined, "the malformed id was not refused");
});

test("a batch the server refuses as a whole (lower --max-batch) is sent one call each", async () => {
  const small = await startDelayd(["--max-batch", "5"]);
  try {
    const sizes = [];
    let unary = 0;
    const count = (next) => async (req) => {
      if (req.method.name === "BatchUpsertTasks") sizes.push(req.message.tasks.length);
      if (req.method.name === "UpsertTask") unary++;
      return next(req);
    };
    const client = createClient(TaskService, createConnectTransport({ baseUrl: small.baseUrl, httpVersion: "1.1", interceptors: [count] }));
    const ns = `ts-pub-small-${process.pid}`;
    const pub = new Publisher(client, { lingerMs: 3_600_000, maxCount: 20 });
    const got = await Promise.allSettled(Array.from({ length: 20 }, (_, i) => pub.upsertTask({ namespace: ns, id: `t${i}`, when: hour })));
    assert.deepEqual(got.filter((r) => r.status !== "fulfilled").map((r) => String(r.reason)), []);
    assert.deepEqual(sizes, [20]);
    assert.equal(unary, 20);
  } finally {
    small.stop();
  }
});
