// Upsert a task, subscribe to its namespace, receive it when it falls due,
// and ack it: the smallest producer + consumer over delayd's HTTP edge
// (the Connect protocol), with the generated delayd.v1 client.
//
//   node example/upsert-and-subscribe.js [http://localhost:7071] [namespace] [api-key]
//
// Run as a program it uses a scratch namespace of its own
// (example-<time>; embedded mode and auth off create it on first use)
// unless one is named, and acks only the task it created: another task
// due in the namespace is left alone (a real namespace's tasks belong to
// their own consumers).
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import { TaskService } from "../src/gen/delayd/v1/task_pb.js";
import { DeliveryService } from "../src/gen/delayd/v1/delivery_pb.js";

/**
 * Upserts task `id` in `namespace` due after `delaySeconds`, subscribes,
 * waits for the delivery of that task, acks it and returns what was
 * delivered. Deliveries of other tasks are neither acked nor nacked: they
 * stay leased to this subscriber until their lease deadline, then go to
 * another one, with no attempt lost to this example.
 *
 * @param {{baseUrl: string, namespace: string, id: string, apiKey?: string, delaySeconds?: number}} opts
 */
export async function upsertAndSubscribe({ baseUrl, namespace, id, apiKey, delaySeconds = 1 }) {
  const transport = createConnectTransport({
    baseUrl,
    httpVersion: "1.1",
    interceptors: apiKey
      ? [(next) => (req) => { req.header.set("Authorization", `Bearer ${apiKey}`); return next(req); }]
      : [],
  });
  const tasks = createClient(TaskService, transport);
  const deliveries = createClient(DeliveryService, transport);

  const up = await tasks.upsertTask({
    namespace,
    id,
    kind: "example.hello",
    payload: new TextEncoder().encode(JSON.stringify({ hello: id })),
    when: { case: "delay", value: { seconds: BigInt(delaySeconds), nanos: 0 } },
  });

  const abort = new AbortController();
  try {
    for await (const res of deliveries.subscribe({ namespace, maxInFlight: 10 }, { signal: abort.signal })) {
      const d = res.delivery;
      if (d.task.id !== id) {
        continue; // not ours
      }
      const ack = await deliveries.ackTasks({ namespace, tokens: [d.token] });
      return {
        created: up.created,
        generation: up.task.generation,
        dueTime: timestampDate(up.task.dueTime),
        delivered: d.task.id,
        attempt: d.task.attempt,
        payload: new TextDecoder().decode(d.task.payload),
        ack: ack.results[0].status,
      };
    }
    throw new Error("the subscription ended before a delivery");
  } finally {
    abort.abort();
  }
}

// Run as a program: print what happened.
if (import.meta.url === `file://${process.argv[1]}`) {
  const [baseUrl = "http://localhost:7071", namespace = `example-${Date.now()}`, apiKey] = process.argv.slice(2);
  const out = await upsertAndSubscribe({ baseUrl, namespace, id: `hello-${Date.now()}`, apiKey });
  console.log(out);
}
