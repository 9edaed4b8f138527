// Consume a namespace on StreamDeliveries: deliveries arrive several per
// message, and the acks go back on the same stream (answered on it), in the
// manner of Pub/Sub's StreamingPull. A bidirectional stream needs HTTP/2
// (httpVersion "2": delayd's HTTP edge speaks HTTP/2 without TLS); over
// HTTP/1.1, and from a browser's fetch, use Subscribe and AckTasks as
// upsert-and-subscribe.js does.
//
// It touches no task but its own: its tasks' kind (example.stream.<time>)
// is one only it uses, and the stream names that kind alone
// (StreamDeliveriesRequest.kinds), so delayd hands it no other consumer's
// task. Run as a program it also uses a scratch namespace of its own
// unless one is named.
//
//   node example/stream-deliveries.js [http://localhost:7071] [namespace] [count] [api-key]
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { TaskService } from "../src/gen/delayd/v1/task_pb.js";
import { DeliveryService, TokenStatus } from "../src/gen/delayd/v1/delivery_pb.js";

/**
 * A queue of requests the stream sends: push adds one, end closes the
 * client's side.
 */
function requestQueue() {
  const items = [];
  let wake = null;
  let done = false;
  return {
    push(req) {
      items.push(req);
      wake?.();
    },
    end() {
      done = true;
      wake?.();
    },
    async *[Symbol.asyncIterator]() {
      for (;;) {
        while (items.length > 0) yield items.shift();
        if (done) return;
        await new Promise((resolve) => (wake = resolve));
        wake = null;
      }
    },
  };
}

/**
 * Upserts `count` tasks due now in `namespace`, of a kind only this call
 * uses (`kind`, default example.stream.<time>), receives them on one
 * StreamDeliveries stream that takes that kind only, acks each batch on
 * the stream and returns what happened: how many deliveries, in how many
 * messages, and the ack results.
 *
 * @param {{baseUrl: string, namespace: string, count?: number, apiKey?: string, kind?: string}} opts
 */
export async function streamDeliveries({ baseUrl, namespace, count = 10, apiKey, kind = `example.stream.${Date.now()}` }) {
  const transport = createConnectTransport({
    baseUrl,
    httpVersion: "2",
    interceptors: apiKey
      ? [(next) => (req) => { req.header.set("Authorization", `Bearer ${apiKey}`); return next(req); }]
      : [],
  });
  const tasks = createClient(TaskService, transport);
  const deliveries = createClient(DeliveryService, transport);

  const run = Date.now().toString(36); // ids of this call's own
  await tasks.batchUpsertTasks({
    namespace,
    tasks: Array.from({ length: count }, (_, i) => ({
      namespace,
      id: `stream-${run}-${i}`,
      kind,
      payload: new TextEncoder().encode(String(i)),
      when: { case: "delay", value: { seconds: 0n, nanos: 0 } },
    })),
  });

  const requests = requestQueue();
  // The first request opens the stream; later ones carry verdicts.
  requests.push({ namespace, maxInFlight: count, maxBatch: count, kinds: [kind] });
  const abort = new AbortController();
  const out = { delivered: [], messages: 0, acked: 0, ackResults: [] };
  try {
    for await (const res of deliveries.streamDeliveries(requests, { signal: abort.signal })) {
      if (res.deliveries.length > 0) {
        const foreign = res.deliveries.find((d) => d.task.kind !== kind);
        if (foreign) throw new Error(`delivered ${foreign.task.id} of kind ${foreign.task.kind}, not this example's`);
        out.messages++;
        out.delivered.push(...res.deliveries.map((d) => d.task.id));
        requests.push({ ackTokens: res.deliveries.map((d) => d.token) });
      }
      for (const r of res.ackResults) {
        out.ackResults.push(r.status);
        if (r.status === TokenStatus.OK) out.acked++;
      }
      if (out.ackResults.length >= count) break;
    }
  } finally {
    requests.end();
    abort.abort();
  }
  return out;
}

// Run as a program: print what happened.
if (import.meta.url === `file://${process.argv[1]}`) {
  const [baseUrl = "http://localhost:7071", namespace = `example-${Date.now()}`, count = "10", apiKey] = process.argv.slice(2);
  console.log(await streamDeliveries({ baseUrl, namespace, count: Number(count), apiKey }));
}
