// Publisher batching for delayd's TaskService, as Pub/Sub's client
// libraries batch Publish: concurrent upsertTask calls coalesce into
// BatchUpsertTasks calls and concurrent unconditional removeTask calls into
// RemoveTasks calls, and every call still resolves or rejects exactly as a
// lone UpsertTask or RemoveTask would (ConnectError with the same code and
// message; for ALREADY_EXISTS and FAILED_PRECONDITION the same
// google.rpc.ErrorInfo and delayd.v1.Task details; removed and
// previous_state). See publisher.d.ts for the API.
import { create, toBinary } from "@bufbuild/protobuf";
import { BinaryWriter } from "@bufbuild/protobuf/wire";
import { Code, ConnectError } from "@connectrpc/connect";
import {
  RemoveTaskResponseSchema, TaskSchema, UpsertTaskRequestSchema, UpsertTaskResponseSchema,
} from "./gen/delayd/v1/task_pb.js";

const MAX_BATCH = 1000;

export class Publisher {
  /**
   * @param {import("@connectrpc/connect").Client<typeof import("./gen/delayd/v1/task_pb.js").TaskService>} tasks
   * @param {import("./publisher.js").PublisherSettings} [settings]
   */
  constructor(tasks, settings = {}) {
    this.tasks = tasks;
    this.linger = settings.lingerMs ?? 0;
    this.maxCount = Math.min(settings.maxCount || MAX_BATCH, MAX_BATCH);
    this.maxBytes = settings.maxBytes || 1 << 20;
    this.maxOutstanding = settings.maxOutstanding || 2;
    this.disabled = settings.disabled ?? false;
    this.queues = new Map(); // namespace -> queue
    this.live = new Set(); // ops not yet answered
    this.flushing = 0;
    this.closed = false;
  }

  /** Upserts one task (req as for TaskService.upsertTask), batched with concurrent calls. */
  upsertTask(req, options) {
    if (this.disabled) return this.tasks.upsertTask(req, options);
    const item = create(UpsertTaskRequestSchema, { ...req, namespace: "" });
    return this.#submit(req.namespace ?? "", {
      kind: "upsert", id: item.id, item, size: toBinary(UpsertTaskRequestSchema, item).length, options,
    });
  }

  /**
   * Removes one task (req as for TaskService.removeTask). Unconditional
   * removes coalesce into RemoveTasks calls, which answer each id; one with
   * ifGeneration goes alone. Either keeps its place after the calls of its id.
   */
  removeTask(req, options) {
    if (this.disabled) return this.tasks.removeTask(req, options);
    const id = req.id ?? "";
    const cond = BigInt(req.ifGeneration ?? 0) !== 0n;
    // size: the id as one element of RemoveTasksRequest.ids
    return this.#submit(req.namespace ?? "", { kind: "remove", id, req, size: id.length + 3, options, cond });
  }

  /** Sends what waits for the linger now and resolves once every call made before it is answered. */
  async flush() {
    this.flushing++;
    try {
      const waits = [...this.live].map((op) => op.promise.catch(() => {}));
      for (const q of this.queues.values()) this.#dispatch(q);
      await Promise.all(waits);
    } finally {
      this.flushing--;
    }
  }

  /** Refuses new calls, then flushes. */
  async close() {
    this.closed = true;
    await this.flush();
  }

  #submit(ns, op) {
    if (this.closed) return Promise.reject(new ConnectError("delayd publisher: closed", Code.FailedPrecondition));
    op.promise = new Promise((resolve, reject) => {
      op.resolve = resolve;
      op.reject = reject;
    });
    // Calls with their own options (headers, signal, timeout) travel alone,
    // as do conditional removes (RemoveTasks takes no condition).
    op.solo = op.options !== undefined || op.cond === true;
    let q = this.queues.get(ns);
    if (!q) {
      q = { ns, ops: [], inflight: 0, busy: new Map(), timer: undefined, ripe: false };
      this.queues.set(ns, q);
    }
    this.live.add(op);
    q.ops.push(op);
    this.#dispatch(q);
    return op.promise;
  }

  #dispatch(q) {
    while (q.ops.length > 0) {
      const head = q.ops[0];
      if (q.busy.get(head.id) > 0) return; // the same id is in flight: wait
      if (q.inflight >= this.maxOutstanding) return;
      if (head.solo) {
        q.inflight++;
        q.ops.shift();
        this.#hold(q, [head]);
        this.#sendOne(q, head);
        continue;
      }
      const [n, full] = this.#cut(q);
      if (n === 0) return;
      if (!full && this.linger > 0 && !q.ripe && this.flushing === 0 && !this.closed) {
        q.timer ??= setTimeout(() => {
          q.timer = undefined;
          q.ripe = true;
          this.#dispatch(q);
        }, this.linger);
        return;
      }
      if (q.timer !== undefined) clearTimeout(q.timer);
      q.timer = undefined;
      q.ripe = false;
      const batch = q.ops.splice(0, n);
      this.#hold(q, batch);
      q.inflight++;
      if (n === 1) this.#sendOne(q, batch[0]);
      else if (batch[0].kind === "remove") this.#sendRemoveBatch(q, batch);
      else this.#sendBatch(q, batch);
    }
    if (q.inflight === 0 && q.busy.size === 0 && q.timer === undefined) this.queues.delete(q.ns);
  }

  // How many ops from q's head form the next batch (of the head's kind),
  // and whether it is full.
  #cut(q) {
    let n = 0;
    let bytes = 0;
    const seen = new Set();
    const kind = q.ops[0].kind;
    for (const op of q.ops) {
      if (n === this.maxCount) return [n, true];
      if (op.kind !== kind || op.solo || q.busy.get(op.id) > 0 || seen.has(op.id)) return [n, n > 0];
      if (n > 0 && bytes + op.size > this.maxBytes) return [n, true];
      seen.add(op.id);
      bytes += op.size;
      n++;
    }
    return [n, n === this.maxCount];
  }

  #hold(q, ops) {
    for (const op of ops) q.busy.set(op.id, (q.busy.get(op.id) ?? 0) + 1);
  }

  #finish(q, ops) {
    for (const op of ops) {
      const n = q.busy.get(op.id) - 1;
      if (n > 0) q.busy.set(op.id, n);
      else q.busy.delete(op.id);
    }
    q.inflight--;
    this.#dispatch(q);
  }

  #answer(op, err, value) {
    this.live.delete(op);
    if (err) op.reject(err);
    else op.resolve(value);
  }

  async #sendOne(q, op) {
    let value;
    let err;
    try {
      value = op.kind === "upsert"
        ? await this.tasks.upsertTask({ ...op.item, namespace: q.ns }, op.options)
        : await this.tasks.removeTask(op.req, op.options);
    } catch (e) {
      err = e;
    }
    this.#finish(q, [op]);
    this.#answer(op, err, value);
  }

  // One RemoveTasks for ops, each answered with its id's result.
  // RemoveTasks checks every id before it removes anything, so when it
  // refuses the whole call with INVALID_ARGUMENT (one id is malformed) each
  // op is sent again alone and gets RemoveTask's own answer.
  async #sendRemoveBatch(q, ops) {
    let resp;
    let err;
    try {
      resp = await this.tasks.removeTasks({ namespace: q.ns, ids: ops.map((op) => op.id) });
    } catch (e) {
      err = e;
    }
    if (err && ConnectError.from(err).code === Code.InvalidArgument) {
      await Promise.all(ops.map(async (op) => {
        try {
          this.#answer(op, undefined, await this.tasks.removeTask(op.req));
        } catch (e) {
          this.#answer(op, e);
        }
      }));
      this.#finish(q, ops);
      return;
    }
    if (!err && resp.results.length !== ops.length) {
      // A delayd from before RemoveTasks answered each id.
      err = new ConnectError(`server answered ${resp.results.length} results for ${ops.length} ids `
        + `(RemoveTasks results need a newer delayd; ${resp.removed} of the ids were removed)`, Code.Unimplemented);
    }
    this.#finish(q, ops);
    ops.forEach((op, i) => {
      if (err) return this.#answer(op, err);
      const r = resp.results[i];
      this.#answer(op, undefined, create(RemoveTaskResponseSchema, { removed: r.removed, previousState: r.previousState }));
    });
  }

  // One BatchUpsertTasks for ops, each answered with its item's result.
  // BatchUpsertTasks answers each item's own error in its result, so an
  // INVALID_ARGUMENT for the whole call is about the batch (more items or
  // payload bytes than the server's --max-batch or
  // --max-batch-payload-bytes): each op is sent again alone and gets
  // UpsertTask's own answer.
  async #sendBatch(q, ops) {
    let resp;
    let err;
    try {
      resp = await this.tasks.batchUpsertTasks({ namespace: q.ns, tasks: ops.map((op) => op.item) });
      if (resp.results.length !== ops.length) {
        throw new ConnectError(`server answered ${resp.results.length} results for ${ops.length} items`, Code.Internal);
      }
    } catch (e) {
      err = e;
    }
    if (err && ConnectError.from(err).code === Code.InvalidArgument) {
      await Promise.all(ops.map(async (op) => {
        try {
          this.#answer(op, undefined, await this.tasks.upsertTask({ ...op.item, namespace: q.ns }));
        } catch (e) {
          this.#answer(op, e);
        }
      }));
      this.#finish(q, ops);
      return;
    }
    this.#finish(q, ops);
    ops.forEach((op, i) => {
      if (err) return this.#answer(op, err);
      const r = resp.results[i];
      if (r.error) return this.#answer(op, itemError(r.error, r.task, op.item, i));
      this.#answer(op, undefined, create(UpsertTaskResponseSchema, { task: r.task, created: r.created }));
    });
  }
}

// itemError is the ConnectError a lone UpsertTask answers for what a batch
// answered as item i's error: the same code and message, and for a failed
// condition the same details (google.rpc.ErrorInfo and the stored task).
function itemError(e, task, item, i) {
  const err = new ConnectError(e.message.replaceAll(`tasks[${i}].`, ""), e.code);
  let reason;
  if (e.code === Code.AlreadyExists) reason = "TASK_EXISTS";
  else if (e.code === Code.FailedPrecondition) reason = "GENERATION_MISMATCH";
  else return err;
  const metadata = {
    generation: String(task?.generation ?? 0n),
    incarnation: String(task?.incarnation ?? 0n),
  };
  if (reason === "GENERATION_MISMATCH") {
    metadata.expected = String(item.ifGeneration);
    if (item.ifIncarnation !== 0n) metadata.expected_incarnation = String(item.ifIncarnation);
  }
  err.details = [{ type: "google.rpc.ErrorInfo", value: errorInfo(reason, "delayd.v1", metadata) }];
  if (task) err.details.push({ type: "delayd.v1.Task", value: toBinary(TaskSchema, task) });
  return err;
}

// errorInfo encodes a google.rpc.ErrorInfo (reason = 1, domain = 2,
// metadata = 3), which the generated code does not include.
function errorInfo(reason, domain, metadata) {
  const w = new BinaryWriter();
  w.tag(1, 2).string(reason);
  w.tag(2, 2).string(domain);
  for (const [k, v] of Object.entries(metadata)) {
    w.tag(3, 2).fork().tag(1, 2).string(k).tag(2, 2).string(v).join();
  }
  return w.finish();
}
