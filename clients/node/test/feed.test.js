// The owner's feed with no server: what Client.subscribe makes of the streams a
// scripted Subscribe serves. Each break is reopened after the last position
// handed out, a repeated position is never handed out twice, a tail feed asks
// for the end again until its first item, a refusal rejects at once, and
// whatever stops the iteration cancels the stream. And the ErrorInfo of an error.
import assert from "node:assert/strict";
import { test } from "node:test";
import { create } from "@bufbuild/protobuf";
import { BinaryWriter } from "@bufbuild/protobuf/wire";
import { Code, ConnectError, errorInfo } from "../dist/index.js";
import { follow } from "../dist/feed.js";
import { SubscribeResponseSchema } from "../dist/gen/leasehold/v1/jobs_pb.js";

function item(position, sequence = 1, type = "job.queued") {
  return create(SubscribeResponseSchema, {
    event: { jobId: `job_${position}`, sequence: BigInt(sequence), type, payload: { at: position } },
    position,
    kind: "ts.feed",
    resourceType: "doc",
    resourceId: `d${position}`,
  });
}

// Each test ends in milliseconds; a hang is a bug, reported rather than waited out.
const TIMEOUT = { timeout: 10_000 };

const unavailable = () => new ConnectError("server draining", Code.Unavailable);

/** A Subscribe that serves one scripted stream per call: its messages, then
 * `then`: the error it ends with, "end" (it ends OK) or "open" (it stays open
 * until cancelled). Records each request and the signal it was given. */
function scripted(streams) {
  const calls = [];
  const open = (request, signal) => {
    const script = streams[calls.length] ?? { messages: [], then: "open" };
    calls.push({ request, signal });
    return (async function* () {
      for (const message of script.messages) yield message;
      if (script.then instanceof Error) throw script.then;
      if (script.then === "end") return;
      await new Promise((_, reject) => {
        const cancelled = () => reject(new ConnectError("cancelled", Code.Canceled));
        if (signal.aborted) cancelled();
        signal.addEventListener("abort", cancelled, { once: true });
      });
    })();
  };
  return { open, calls };
}

async function take(feed, count) {
  const items = [];
  for await (const it of feed) {
    items.push(it);
    if (items.length === count) break;
  }
  return items;
}

test("an item is the event as watch gives it, with its position, kind and resource", TIMEOUT, async () => {
  const { open, calls } = scripted([{ messages: [item("0000000000000001", 1)], then: "open" }]);
  const [first] = await take(
    follow(open, { kinds: ["ts.feed"], resourceType: "doc", eventTypes: ["job.queued"] }),
    1,
  );
  assert.deepEqual(first, {
    event: {
      jobId: "job_0000000000000001",
      sequence: 1,
      type: "job.queued",
      payload: { at: "0000000000000001" },
      createdAt: undefined,
    },
    position: "0000000000000001",
    kind: "ts.feed",
    resourceType: "doc",
    resourceId: "d0000000000000001",
  });
  assert.deepEqual(calls[0].request, {
    afterPosition: "",
    tail: false,
    kinds: ["ts.feed"],
    resourceType: "doc",
    eventTypes: ["job.queued"],
  });
});

test(
  "a break reopens after the last position handed out; a position at or before it is skipped",
  TIMEOUT,
  async () => {
    const { open, calls } = scripted([
      { messages: [item("0000000000000001"), item("0000000000000002")], then: unavailable() },
      // A server that answers from further back than asked: nothing is handed out twice.
      {
        messages: [item("0000000000000001"), item("0000000000000002"), item("0000000000000003")],
        then: unavailable(),
      },
      { messages: [], then: unavailable() }, // an outage: nothing comes
      { messages: [item("0000000000000003"), item("0000000000000004")], then: "open" },
    ]);
    const items = await take(follow(open, { afterPosition: "0000000000000000", kinds: ["k"] }), 4);
    assert.deepEqual(
      items.map((i) => i.position),
      ["0000000000000001", "0000000000000002", "0000000000000003", "0000000000000004"],
    );
    assert.deepEqual(
      calls.map((c) => [c.request.afterPosition, c.request.tail, c.request.kinds]),
      [
        ["0000000000000000", false, ["k"]],
        ["0000000000000002", false, ["k"]],
        ["0000000000000003", false, ["k"]],
        ["0000000000000003", false, ["k"]],
      ],
    );
  },
);

test("a tail feed asks for the end again until its first item, then resumes after it", TIMEOUT, async () => {
  const { open, calls } = scripted([
    { messages: [], then: unavailable() },
    { messages: [item("000000000000000a")], then: unavailable() },
    { messages: [item("000000000000000b")], then: "open" },
  ]);
  const items = await take(follow(open, { tail: true }), 2);
  assert.deepEqual(
    items.map((i) => i.position),
    ["000000000000000a", "000000000000000b"],
  );
  assert.deepEqual(
    calls.map((c) => [c.request.afterPosition, c.request.tail]),
    [
      ["", true],
      ["", true],
      ["000000000000000a", false],
    ],
  );
});

test("a stream that ends by itself is reopened like a break", TIMEOUT, async () => {
  const { open, calls } = scripted([
    { messages: [item("0000000000000001")], then: "end" },
    { messages: [item("0000000000000002")], then: "open" },
  ]);
  const items = await take(follow(open), 2);
  assert.deepEqual(
    items.map((i) => i.position),
    ["0000000000000001", "0000000000000002"],
  );
  assert.equal(calls[1].request.afterPosition, "0000000000000001");
});

/** An error as a Leasehold server sends it: with an ErrorInfo. */
function refusal(code, reason) {
  const error = new ConnectError("refused", code);
  const info = new BinaryWriter().tag(1, 2).string(reason).tag(2, 2).string("leasehold").finish();
  error.details = [{ type: "google.rpc.ErrorInfo", value: info }];
  return error;
}

test(
  "a break of any kind is reopened: a drain, a reset stream, a server that died under it",
  TIMEOUT,
  async () => {
    const breaks = [
      new ConnectError("server draining", Code.Unavailable),
      new ConnectError("stream reset", Code.Internal),
      new ConnectError("proxy", Code.Unknown),
      new ConnectError("read ECONNRESET", Code.Aborted),
      new ConnectError("http/2 stream closed with error code CANCEL (0x8)", Code.Canceled),
    ];
    const { open, calls } = scripted([
      ...breaks.map((error, i) => ({ messages: [item(`000000000000000${i}`)], then: error })),
      { messages: [item("0000000000000009")], then: "open" },
    ]);
    const items = await take(follow(open), breaks.length + 1);
    assert.deepEqual(
      items.map((i) => i.position),
      [
        "0000000000000000",
        "0000000000000001",
        "0000000000000002",
        "0000000000000003",
        "0000000000000004",
        "0000000000000009",
      ],
    );
    assert.equal(calls.length, breaks.length + 1);
  },
);

test("a refusal rejects at once, after what came before it, with its code and reason", TIMEOUT, async () => {
  const refusals = [
    refusal(Code.InvalidArgument, "INVALID_ARGUMENT"),
    refusal(Code.OutOfRange, "FEED_POSITION_EXPIRED"),
    refusal(Code.PermissionDenied, "KINDS_NOT_PERMITTED"),
    refusal(Code.ResourceExhausted, "MAX_WATCH_STREAMS_PER_OWNER_EXCEEDED"),
    refusal(Code.Unauthenticated, "OWNER_UNRESOLVED"),
    refusal(Code.Aborted, "SOMETHING_ABORTED"), // a server's ABORTED, not a dead connection
    new Error("not a ConnectError"),
  ];
  for (const refused of refusals) {
    const { open, calls } = scripted([{ messages: [item("0000000000000001")], then: refused }]);
    const seen = [];
    await assert.rejects(
      (async () => {
        for await (const it of follow(open)) seen.push(it.position);
      })(),
      (error) => error === refused,
    );
    assert.deepEqual(seen, ["0000000000000001"]);
    assert.equal(calls.length, 1, refused.message);
  }
});

test("breaking out of the loop cancels the stream", TIMEOUT, async () => {
  const { open, calls } = scripted([{ messages: [item("0000000000000001")], then: "open" }]);
  await take(follow(open), 1);
  assert.equal(calls.length, 1);
  assert.equal(calls[0].signal.aborted, true);
});

test(
  "aborting the signal cancels the stream and rejects with Canceled, reopening nothing",
  TIMEOUT,
  async () => {
    const controller = new AbortController();
    const { open, calls } = scripted([{ messages: [item("0000000000000001")], then: "open" }]);
    const seen = [];
    await assert.rejects(
      (async () => {
        for await (const it of follow(open, { signal: controller.signal })) {
          seen.push(it.position);
          controller.abort();
        }
      })(),
      (error) => ConnectError.from(error).code === Code.Canceled,
    );
    assert.deepEqual(seen, ["0000000000000001"]);
    assert.equal(calls.length, 1);
    assert.equal(calls[0].signal.aborted, true);
  },
);

test(
  "reconnecting gives up with the last error once the outage outlasts reconnectDeadlineMs",
  TIMEOUT,
  async () => {
    const { open, calls } = scripted([
      { messages: [item("0000000000000001")], then: unavailable() },
      ...Array.from({ length: 50 }, () => ({ messages: [], then: unavailable() })),
    ]);
    const seen = [];
    await assert.rejects(
      (async () => {
        for await (const it of follow(open, { reconnectDeadlineMs: 0 })) seen.push(it.position);
      })(),
      (error) => ConnectError.from(error).code === Code.Unavailable,
    );
    assert.deepEqual(seen, ["0000000000000001"]);
    assert.equal(calls.length, 1);
  },
);

test("errorInfo reads the reason, domain and metadata the server sent; undefined when none", () => {
  const entry = new BinaryWriter().tag(1, 2).string("oldest_position").tag(2, 2).string("00000000000000ff");
  const bytes = new BinaryWriter()
    .tag(1, 2)
    .string("FEED_POSITION_EXPIRED")
    .tag(2, 2)
    .string("leasehold")
    .tag(3, 2)
    .bytes(entry.finish())
    .finish();
  const error = new ConnectError("expired", Code.OutOfRange);
  error.details = [
    { type: "google.rpc.BadRequest", value: new Uint8Array() },
    { type: "google.rpc.ErrorInfo", value: bytes },
  ];
  assert.deepEqual(errorInfo(error), {
    reason: "FEED_POSITION_EXPIRED",
    domain: "leasehold",
    metadata: { oldest_position: "00000000000000ff" },
  });
  assert.equal(errorInfo(new ConnectError("refused", Code.Unavailable)), undefined);
  assert.equal(errorInfo(new Error("not from a server")), undefined);
});
