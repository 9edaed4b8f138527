// Create a schedule, receive its first firing as an ordinary task, and
// delete the schedule: recurring tasks over delayd's HTTP edge (the
// Connect protocol), with the generated delayd.v1 client.
//
//   node example/schedule.js [http://localhost:7071] [namespace] [api-key]
//
// The schedule fires every second (a rate); a cron rule in a time zone
// is one field away: { rule: { case: "cron", value: "0 9 * * 1-5" },
// timeZone: "Europe/Berlin" }. Each firing is a task whose id is the
// schedule's id and the slot's time, delivered to subscribers like any
// other.
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { timestampDate } from "@bufbuild/protobuf/wkt";
import { ScheduleService, CatchUpPolicy } from "../src/gen/delayd/v1/schedule_pb.js";
import { DeliveryService } from "../src/gen/delayd/v1/delivery_pb.js";

/**
 * Creates schedule `id` of `namespace` (every second), previews its next
 * firings, takes its first firing from a subscription, acks it, deletes
 * the schedule and returns what it saw.
 *
 * @param {{baseUrl: string, namespace: string, id: string, apiKey?: string}} opts
 */
export async function scheduleAndReceive({ baseUrl, namespace, id, apiKey }) {
  const transport = createConnectTransport({
    baseUrl,
    httpVersion: "1.1",
    interceptors: apiKey
      ? [(next) => (req) => { req.header.set("Authorization", `Bearer ${apiKey}`); return next(req); }]
      : [],
  });
  const schedules = createClient(ScheduleService, transport);
  const deliveries = createClient(DeliveryService, transport);

  const created = await schedules.createSchedule({
    schedule: {
      namespace,
      id,
      rule: { case: "every", value: { seconds: 1n } },
      catchUp: CatchUpPolicy.LATEST,
      task: { kind: "example.tick", payload: new TextEncoder().encode(JSON.stringify({ schedule: id })) },
    },
  });
  const preview = await schedules.previewSchedule({ namespace, id, count: 3 });

  const abort = new AbortController();
  let firing;
  try {
    for await (const res of deliveries.subscribe({ namespace, maxInFlight: 10 }, { signal: abort.signal })) {
      const d = res.delivery;
      if (!d.task.id.startsWith(id + ".")) {
        continue; // not ours
      }
      await deliveries.ackTasks({ namespace, tokens: [d.token] });
      firing = { id: d.task.id, kind: d.task.kind, dueTime: timestampDate(d.task.dueTime) };
      break;
    }
  } finally {
    abort.abort();
  }
  const deleted = await schedules.deleteSchedule({ namespace, id });
  return {
    state: created.schedule.state,
    nextSlots: preview.firings.map((f) => f.localTime),
    tzDataVersion: preview.tzDataVersion,
    firing,
    removedFirings: deleted.removedFirings,
  };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const [baseUrl = "http://localhost:7071", namespace = `example-${Date.now()}`, apiKey] = process.argv.slice(2);
  const out = await scheduleAndReceive({ baseUrl, namespace, id: "tick", apiKey });
  console.log(out);
}
