// The owner's feed against real servers: each job's events with its kind and
// resource, in commit order; the filters; a feed that resumes by itself across a
// server restart and from a stored position; an expired or malformed position;
// breaking out of the loop ends the stream on the server. Each test is an owner
// of its own, so its feed holds its own jobs' events only.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { Client, Code, ConnectError, errorInfo } from "../dist/index.js";
import { Server } from "./server.js";

const TIMEOUT = { timeout: 60_000 };

const server = new Server();
const retaining = new Server(["--retention", "1s"]); // keeps a finished job for a second
const limited = new Server(["--max-watch-streams-per-owner", "1"]); // lets an owner hold one stream

before(async () => {
  // One at a time: each start has its own 30 s, however busy the machine.
  for (const each of [server, retaining, limited]) await each.start();
});

after(async () => {
  // Every one, started or not: a server left running keeps this process alive.
  await Promise.all([server.close(), retaining.close(), limited.close()]);
});

function clientOf(owner, on = server) {
  return new Client({ server: on.address, ownerId: `ts-feed-${owner}` });
}

/** The first `count` items of the feed, then out of the loop. */
async function take(feed, count) {
  const items = [];
  for await (const item of feed) {
    items.push(item);
    if (items.length === count) break;
  }
  return items;
}

/** A feed read in the background until `stop()` (or the test's end);
 * `until(n)` resolves once n items came. */
function reading(t, client, options = {}) {
  const controller = new AbortController();
  const items = [];
  const waiters = [];
  const done = (async () => {
    try {
      for await (const item of client.subscribe({ ...options, signal: controller.signal })) {
        items.push(item);
        for (const waiter of waiters.filter((w) => items.length >= w.count)) waiter.resolve();
      }
    } catch (error) {
      if (!controller.signal.aborted) throw error;
    }
  })();
  done.catch(() => {}); // reported by until() or stop(), whichever comes first
  const stop = () => (controller.abort(), done);
  t.after(stop);
  return {
    items,
    stop,
    until: (count) =>
      items.length >= count
        ? Promise.resolve()
        : Promise.race([new Promise((resolve) => waiters.push({ count, resolve })), done]),
  };
}

const summary = (item) => [item.event.jobId, item.event.type];

function assertInFeedOrder(items) {
  const positions = items.map((i) => i.position);
  assert.deepEqual([...positions].sort(), positions);
  assert.equal(new Set(positions).size, positions.length);
}

test("the feed carries each job's events with its kind and resource, in commit order", TIMEOUT, async (t) => {
  const client = clientOf("order");
  const first = await client.enqueue({ kind: "ts.feed.order", resourceType: "doc", resourceId: "d1" });
  const feed = reading(t, client); // from the oldest event: replays the first job's
  await feed.until(1);
  const second = await client.enqueue({ kind: "ts.feed.other", resourceType: "img", resourceId: "i1" });
  await client.cancel(first.job.id);
  await feed.until(3);
  await feed.stop();
  assert.deepEqual(feed.items.map(summary), [
    [first.job.id, "job.queued"],
    [second.job.id, "job.queued"],
    [first.job.id, "job.cancelled"],
  ]);
  assert.deepEqual(
    feed.items.map((i) => [i.kind, i.resourceType, i.resourceId]),
    [
      ["ts.feed.order", "doc", "d1"],
      ["ts.feed.other", "img", "i1"],
      ["ts.feed.order", "doc", "d1"],
    ],
  );
  assert.deepEqual(
    feed.items.map((i) => i.event.sequence),
    [1, 1, 2],
  );
  assertInFeedOrder(feed.items);
});

test("tail starts at the end: only events committed after the feed opened", TIMEOUT, async (t) => {
  const client = clientOf("tail");
  const before = await client.enqueue({ kind: "ts.feed.tail" });
  // Nothing shows a tail feed is open before its first item: enqueue probes
  // until one arrives. Every event after that one arrives too.
  const feed = reading(t, client, { tail: true });
  const probes = [];
  while (feed.items.length === 0) {
    probes.push((await client.enqueue({ kind: "ts.feed.tail" })).job.id);
    await Promise.race([feed.until(1), new Promise((r) => setTimeout(r, 50))]);
  }
  const from = probes.indexOf(feed.items[0].event.jobId);
  assert.ok(from >= 0, "the first item of a tail feed is from before it opened");
  await client.cancel(before.job.id);
  const expected = [...probes.slice(from).map((id) => [id, "job.queued"]), [before.job.id, "job.cancelled"]];
  await feed.until(expected.length);
  await feed.stop();
  assert.deepEqual(feed.items.map(summary), expected);
  assertInFeedOrder(feed.items);
});

test("kinds, resourceType and eventTypes each narrow the feed", TIMEOUT, async () => {
  const client = clientOf("filters");
  const x = await client.enqueue({ kind: "ts.feed.x", resourceType: "doc", resourceId: "1" });
  const y = await client.enqueue({ kind: "ts.feed.y", resourceType: "img", resourceId: "2" });
  await client.cancel(x.job.id);
  await client.cancel(y.job.id);
  // The last event of each filtered feed below; every event before it was already committed.
  const lastX = await client.enqueue({ kind: "ts.feed.x", resourceType: "img", resourceId: "3" });
  await client.cancel(lastX.job.id);

  const ofKindX = await take(client.subscribe({ kinds: ["ts.feed.x"] }), 4);
  assert.deepEqual(ofKindX.map(summary), [
    [x.job.id, "job.queued"],
    [x.job.id, "job.cancelled"],
    [lastX.job.id, "job.queued"],
    [lastX.job.id, "job.cancelled"],
  ]);
  const ofImages = await take(client.subscribe({ resourceType: "img" }), 4);
  assert.deepEqual(ofImages.map(summary), [
    [y.job.id, "job.queued"],
    [y.job.id, "job.cancelled"],
    [lastX.job.id, "job.queued"],
    [lastX.job.id, "job.cancelled"],
  ]);
  const cancels = await take(client.subscribe({ eventTypes: ["job.cancelled"] }), 3);
  assert.deepEqual(cancels.map(summary), [
    [x.job.id, "job.cancelled"],
    [y.job.id, "job.cancelled"],
    [lastX.job.id, "job.cancelled"],
  ]);
  const both = await take(
    client.subscribe({ kinds: ["ts.feed.y", "ts.feed.x"], eventTypes: ["job.queued"] }),
    3,
  );
  assert.deepEqual(both.map(summary), [
    [x.job.id, "job.queued"],
    [y.job.id, "job.queued"],
    [lastX.job.id, "job.queued"],
  ]);
});

test(
  "a feed resumes by itself after a drain and after a crash: each event exactly once",
  TIMEOUT,
  async (t) => {
    const client = clientOf("restart");
    const first = await client.enqueue({ kind: "ts.feed.restart" });
    const feed = reading(t, client);
    await feed.until(1);
    await server.stop("SIGTERM"); // the drain ends the stream UNAVAILABLE
    await server.start(); // same port, same database
    // Committed while the feed may still be away: replayed when it is back.
    const second = await client.enqueue({ kind: "ts.feed.restart" });
    await client.cancel(first.job.id);
    await feed.until(3);
    await server.stop("SIGKILL"); // no status at all: the connection dies under the stream
    await server.start();
    await client.cancel(second.job.id);
    await feed.until(4);
    await feed.stop();
    assert.deepEqual(feed.items.map(summary), [
      [first.job.id, "job.queued"],
      [second.job.id, "job.queued"],
      [first.job.id, "job.cancelled"],
      [second.job.id, "job.cancelled"],
    ]);
    assertInFeedOrder(feed.items);
  },
);

test("a stored position resumes after it: no gap, no repeat", TIMEOUT, async () => {
  const client = clientOf("stored");
  const ids = [];
  for (let i = 0; i < 4; i++) ids.push((await client.enqueue({ kind: "ts.feed.stored" })).job.id);
  const firstTwo = await take(client.subscribe(), 2);
  const stored = firstTwo.at(-1).position;
  const rest = await take(client.subscribe({ afterPosition: stored }), 2);
  assert.deepEqual(
    [...firstTwo, ...rest].map((i) => i.event.jobId),
    ids,
  );
  assertInFeedOrder([...firstTwo, ...rest]);
});

test(
  "a malformed position, or one with tail, is INVALID_ARGUMENT naming after_position",
  TIMEOUT,
  async () => {
    const client = clientOf("malformed");
    for (const options of [
      { afterPosition: "not a position" },
      { afterPosition: "0000000000000000", tail: true },
    ]) {
      await assert.rejects(take(client.subscribe(options), 1), (error) => {
        const refused = ConnectError.from(error);
        assert.equal(refused.code, Code.InvalidArgument, refused.message);
        assert.match(refused.rawMessage, /after_position/);
        return true;
      });
    }
  },
);

test(
  "a position retention has passed is OUT_OF_RANGE, FEED_POSITION_EXPIRED naming the oldest kept",
  TIMEOUT,
  async () => {
    const client = clientOf("expired", retaining);
    const gone = await client.enqueue({ kind: "ts.feed.expired" });
    await client.cancel(gone.job.id);
    const kept = await client.enqueue({ kind: "ts.feed.expired" }); // still queued: never deleted
    const [queued] = await take(client.subscribe(), 1);
    assert.equal(queued.event.jobId, gone.job.id);
    // Retention sweeps as a server starts (then each minute): restart until the
    // finished job has been deleted, a second or more after it ended.
    for (let restarts = 0; ; restarts++) {
      const deleted = await client.get(gone.job.id).then(
        () => false,
        (error) => ConnectError.from(error).code === Code.PermissionDenied,
      );
      if (deleted) break;
      assert.ok(restarts < 20, "retention never deleted the finished job");
      await retaining.stop("SIGTERM");
      await retaining.start();
    }
    // After the first event of a job now gone: its second is missing from the feed.
    let oldest;
    await assert.rejects(take(client.subscribe({ afterPosition: queued.position }), 1), (error) => {
      const refused = ConnectError.from(error);
      assert.equal(refused.code, Code.OutOfRange, refused.message);
      const info = errorInfo(refused);
      assert.equal(info?.reason, "FEED_POSITION_EXPIRED");
      oldest = info.metadata.oldest_position;
      return true;
    });
    assert.ok(oldest > queued.position, `oldest_position ${oldest}`);
    // Resuming from the oldest kept position serves the kept job's events.
    const later = await client.enqueue({ kind: "ts.feed.expired" });
    const resumed = [];
    for await (const item of client.subscribe({ afterPosition: oldest })) {
      resumed.push(item.event.jobId);
      if (item.event.jobId === later.job.id) break;
    }
    assert.ok(!resumed.includes(gone.job.id));
    assert.deepEqual(
      resumed.filter((id) => id !== kept.job.id),
      [later.job.id],
    );
  },
);

test("breaking out of the loop ends the stream on the server", TIMEOUT, async () => {
  const client = clientOf("break", limited);
  await client.enqueue({ kind: "ts.feed.break" });
  for await (const item of client.subscribe()) {
    assert.equal(item.event.type, "job.queued");
    // The owner's one stream is open: a second is refused at once, not retried.
    await assert.rejects(
      take(client.subscribe(), 1),
      (error) => ConnectError.from(error).code === Code.ResourceExhausted,
    );
    break;
  }
  // Once the server has seen the cancel the slot is free again (a bounded number of tries).
  for (let tries = 0; ; tries++) {
    try {
      const [item] = await take(client.subscribe(), 1);
      assert.equal(item.event.type, "job.queued");
      break;
    } catch (error) {
      assert.equal(ConnectError.from(error).code, Code.ResourceExhausted);
      assert.ok(tries < 100, "the stream the loop broke out of is still open on the server");
      await new Promise((r) => setTimeout(r, 20));
    }
  }
});
