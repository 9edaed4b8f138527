// Runs the example against a real delayd: the binary in DELAYD_BIN (make
// test builds it), started in embedded mode on free loopback ports.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { TaskService } from "../src/gen/delayd/v1/task_pb.js";
import { TaskState } from "../src/gen/delayd/v1/task_pb.js";
import { TokenStatus } from "../src/gen/delayd/v1/delivery_pb.js";
import { upsertAndSubscribe } from "../example/upsert-and-subscribe.js";

let delayd;
let baseUrl;

before(async () => {
  const bin = process.env.DELAYD_BIN;
  assert.ok(bin, "DELAYD_BIN must name a delayd binary (make test-ts builds bin/delayd-race)");
  // Every listener on a free port: a delayd already running on this
  // machine (make run holds 7070, 7071 and 9070) must not stop this one.
  // None of the caller's DELAYD_* settings (an exported DELAYD_ADMIN_KEY
  // would turn auth on): embedded mode, as make run.
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("DELAYD_")));
  delayd = spawn(bin, ["--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--ops-listen", "127.0.0.1:0", "--log-level", "info"], {
    env,
    stdio: ["ignore", "ignore", "pipe"],
  });
  // The serving line names the HTTP edge's address.
  const seen = [];
  baseUrl = await new Promise((resolve, reject) => {
    const lines = createInterface({ input: delayd.stderr });
    lines.on("line", (line) => {
      seen.push(line);
      const m = /msg="delayd serving" .*http_addr=(\S+)/.exec(line);
      if (m) resolve(`http://${m[1]}`);
    });
    // "close" comes after its stderr ended: its last lines say why (e.g.
    // "ops listen on ...: address already in use").
    delayd.on("close", (code) => reject(new Error(`delayd exited (${code}) before serving:\n${seen.slice(-3).join("\n")}`)));
  });
});

after(() => {
  delayd?.kill("SIGTERM");
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

test("a bad request is InvalidArgument naming the field", async () => {
  const tasks = createClient(TaskService, createConnectTransport({ baseUrl, httpVersion: "1.1" }));
  await assert.rejects(
    tasks.upsertTask({ namespace: "ts-example", id: "bad/id", when: { case: "delay", value: { seconds: 1n } } }),
    (err) => err instanceof ConnectError && err.code === Code.InvalidArgument && /id has '\/'/.test(err.rawMessage),
  );
  const listed = await tasks.listTasks({ namespace: "ts-example", state: TaskState.SCHEDULED });
  assert.deepEqual(listed.tasks, []);
});
