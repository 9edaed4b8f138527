import type { CallOptions, Client } from "@connectrpc/connect";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type {
  RemoveTaskRequestSchema,
  RemoveTaskResponse,
  TaskService,
  UpsertTaskRequestSchema,
  UpsertTaskResponse,
} from "./gen/delayd/v1/task_pb.js";

/** How concurrent upsertTask calls coalesce into BatchUpsertTasks calls. */
export interface PublisherSettings {
  /** Send every call as its own RPC, as without a Publisher. Default false. */
  disabled?: boolean;
  /**
   * How long a batch that is not full waits for more calls, in ms, from its
   * first call. Default 0: a call is sent at once while fewer than
   * maxOutstanding batches of its namespace are in flight, and what arrives
   * meanwhile goes together ("Nagle off": a lone caller waits for nothing).
   */
  lingerMs?: number;
  /** Most calls per batch. Default and maximum 1,000 (delayd's --max-batch). */
  maxCount?: number;
  /** Most encoded bytes of one batch's items. Default 1 MiB. */
  maxBytes?: number;
  /** Most batches of one namespace in flight. Default 2. */
  maxOutstanding?: number;
}

/**
 * Publisher batches a TaskService client's upserts and removes, as Pub/Sub's
 * client libraries batch Publish. Each call resolves or rejects as a lone
 * UpsertTask or RemoveTask would (same ConnectError code and message; ALREADY_EXISTS and
 * FAILED_PRECONDITION carry the same ErrorInfo and Task details), and calls
 * for one namespace and id are applied in call order. A call given its own
 * CallOptions is sent alone, in its place. A batch of one is a plain
 * UpsertTask (RemoveTask).
 */
export declare class Publisher {
  constructor(tasks: Client<typeof TaskService>, settings?: PublisherSettings);
  upsertTask(req: MessageInitShape<typeof UpsertTaskRequestSchema>, options?: CallOptions): Promise<UpsertTaskResponse>;
  /**
   * Unconditional removes coalesce into RemoveTasks (each resolves with its
   * own id's removed and previousState, as a lone RemoveTask); one with
   * ifGeneration goes alone. Ordered with the other calls of its id.
   */
  removeTask(req: MessageInitShape<typeof RemoveTaskRequestSchema>, options?: CallOptions): Promise<RemoveTaskResponse>;
  /** Sends what lingers now; resolves when every call made before it is answered. */
  flush(): Promise<void>;
  /** Refuses new calls (FAILED_PRECONDITION "closed"), then flushes. */
  close(): Promise<void>;
}
