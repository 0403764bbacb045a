// Finishing writes that end together travel together (WorkerService.Finish,
// the server's "batch_finish" feature).
//
// Jobs claimed together tend to end together, and a call per outcome costs
// both processes more than the write. One Finish is in flight at a time: an
// outcome that arrives while none is goes at once (a lone job waits for
// nothing), and those that arrive meanwhile go together in the next. Each
// outcome keeps its own lease token and gets its own answer, raised exactly
// as its single call would raise it (ABORTED for a lost lease,
// INVALID_ARGUMENT naming the field), so the worker's retry and fencing rules
// apply unchanged; a repeat is answered as the first write was.
import { Code, ConnectError } from "@connectrpc/connect";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { Job } from "./gen/leasehold/v1/jobs_pb.js";
import type { FinishRequestSchema, FinishResponse, OutcomeSchema } from "./gen/leasehold/v1/worker_pb.js";

export type OutcomeInit = MessageInitShape<typeof OutcomeSchema>;
type FinishCall = (
  request: MessageInitShape<typeof FinishRequestSchema>,
  options: { timeoutMs: number },
) => Promise<FinishResponse>;

/** The server takes up to 1,000 outcomes in one call. */
const MAX_OUTCOMES_PER_CALL = 1000;

interface Waiting {
  outcome: OutcomeInit;
  resolve: (job: Job | undefined) => void;
  reject: (error: unknown) => void;
}

export class FinishBatcher {
  private waiting: Waiting[] = [];
  private sending = false;

  constructor(
    private readonly send: FinishCall,
    private readonly timeoutMs: number,
  ) {}

  /** The job as the outcome left it, or the error its single call would raise. */
  finish(outcome: OutcomeInit): Promise<Job | undefined> {
    return new Promise((resolve, reject) => {
      this.waiting.push({ outcome, resolve, reject });
      if (!this.sending) void this.sendWaiting();
    });
  }

  private async sendWaiting(): Promise<void> {
    this.sending = true;
    try {
      // Let the outcomes of handlers ending in this same turn join the first call.
      await Promise.resolve();
      while (this.waiting.length > 0) {
        await this.sendBatch(this.waiting.splice(0, MAX_OUTCOMES_PER_CALL));
      }
    } finally {
      this.sending = false;
    }
  }

  private async sendBatch(batch: Waiting[]): Promise<void> {
    let response: FinishResponse;
    try {
      response = await this.send({ outcomes: batch.map((w) => w.outcome) }, { timeoutMs: this.timeoutMs });
    } catch (error) {
      for (const waiting of batch) waiting.reject(error);
      return;
    }
    batch.forEach((waiting, index) => {
      const result = response.results[index];
      if (result === undefined) {
        waiting.reject(new ConnectError("the server answered fewer outcomes than sent", Code.Internal));
      } else if (result.lost) {
        waiting.reject(new ConnectError("lease lost", Code.Aborted));
      } else if (result.invalid !== undefined) {
        waiting.reject(
          new ConnectError(`${result.invalid.field}: ${result.invalid.description}`, Code.InvalidArgument),
        );
      } else {
        waiting.resolve(result.job);
      }
    });
  }
}
