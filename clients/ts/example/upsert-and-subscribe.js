// Upsert a task, subscribe to its namespace, receive it when it falls due,
// and ack it: the smallest producer + consumer over delayd's HTTP edge
// (the Connect protocol), with the generated delayd.v1 client.
//
//   node example/upsert-and-subscribe.js [http://localhost:7071] [namespace] [api-key]
//
// It touches no task but its own: its task's kind (example.hello.<id>) is
// one only it uses, and it subscribes to that kind alone (SubscribeRequest
// .kinds), so delayd never hands it another consumer's task: no lease held
// on one, no attempt spent. Run as a program it also uses a scratch
// namespace of its own (example-<time>; embedded mode and auth off create
// it on first use) unless one is named.
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import { TaskService } from "../src/gen/delayd/v1/task_pb.js";
import { DeliveryService } from "../src/gen/delayd/v1/delivery_pb.js";

/**
 * Upserts task `id` in `namespace` due after `delaySeconds`, with a kind
 * only it has, subscribes to that kind only, waits for the delivery of the
 * task, acks it and returns what was delivered. The stream receives no
 * other task of the namespace, so no other consumer's task is leased,
 * delayed or charged an attempt by this example.
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

  // A kind no other consumer uses: the subscription below names it, so it
  // receives this task and nothing else.
  const kind = `example.hello.${id}`;
  const up = await tasks.upsertTask({
    namespace,
    id,
    kind,
    payload: new TextEncoder().encode(JSON.stringify({ hello: id })),
    when: { case: "delay", value: { seconds: BigInt(delaySeconds), nanos: 0 } },
  });

  const abort = new AbortController();
  try {
    for await (const res of deliveries.subscribe({ namespace, maxInFlight: 1, kinds: [kind] }, { signal: abort.signal })) {
      const d = res.delivery;
      if (d.task.id !== id) {
        throw new Error(`delivered ${d.task.id}, which is not this example's task`);
      }
      const ack = await deliveries.ackTasks({ namespace, tokens: [d.token] });
      return {
        created: up.created,
        generation: up.task.generation,
        dueTime: timestampDate(up.task.dueTime),
        delivered: d.task.id,
        kind: d.task.kind,
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
