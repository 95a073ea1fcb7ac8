'use strict';
// Taking answers from the result store (docs/protocol.md, "How answers travel").
const crypto = require('node:crypto');

const resultKey = (caller, requestId) => `ds:result:${caller}:${requestId}`;
const replyKey = (caller, channel) => `ds:reply:${caller}:${channel}`;

// A blocking pop holds its connection, so every wait gets one of its own, reused afterwards.
class ConnectionPool {
  constructor(redis) {
    this.redis = redis;
    this.idle = [];
    this.all = [];
  }

  async use(work) {
    let connection = this.idle.pop();
    if (!connection) {
      connection = this.redis.duplicate();
      this.all.push(connection);
    }
    try {
      return await work(connection);
    } finally {
      this.idle.push(connection);
    }
  }

  async close() {
    await Promise.all(this.all.map((c) => c.quit().catch(() => c.disconnect())));
  }
}

// Without a reply channel: BLPOP the request's own key for the whole time left. Never a
// shorter slice: Redis times the BLPOP from when it runs it, and an answer popped for a
// connection that is then closed is lost.
class ResultWaiter {
  constructor(redis) {
    this.redis = redis;
    this.pool = new ConnectionPool(redis);
  }

  // Resolves to the encoded ResponseEnvelope, or null when the deadline passed without one.
  async wait(caller, requestId, deadlineMs) {
    const key = resultKey(caller, requestId);
    const seconds = (deadlineMs - Date.now()) / 1000;
    // BLPOP's timeout 0 means "forever": with no time left, only look once.
    if (seconds < 0.01) return this.redis.lpopBuffer(key);
    const popped = await this.pool.use((c) => c.blpopBuffer(key, seconds.toFixed(3)));
    return popped ? popped[1] : null;
  }

  close() {
    return this.pool.close();
  }
}

// With a reply channel: one connection reads every caller's channel list with BLMPOP, many
// answers a round trip, and hands each to the request it names. The answers that still go
// under a request's own key (refusals before the signature is verified, INTERNAL) are found by
// looking there 1, 2, 4, 8 ... seconds after the request was sent.
const LONGEST_BLOCK_S = 0.5;
const ANSWERS_PER_READ = 100;

class ReplyReader {
  constructor(redis, decodeRequestId) {
    this.redis = redis;
    this.reader = redis.duplicate();
    this.decodeRequestId = decodeRequestId;
    this.channel = `node-${crypto.randomBytes(8).toString('hex')}`;
    this.pending = new Map(); // request id -> { caller, sentAt, nextLookMs, deadlineMs, resolve }
    this.running = null;
    this.closed = false;
  }

  // Resolves to { bytes, via: 'channel' | 'key' }, or null when the deadline passed. Called
  // before the request is published: an answer read for no one is dropped.
  wait(caller, requestId, deadlineMs) {
    return new Promise((resolve, reject) => {
      const sentAt = Date.now();
      this.pending.set(requestId, { caller, sentAt, nextLookMs: 1000, deadlineMs, resolve, reject });
      this.ensureRunning();
    });
  }

  // One read loop at a time, running while anyone waits. A wait that arrives as the loop is
  // finishing restarts it.
  ensureRunning() {
    if (this.running || this.closed) return;
    this.running = this.run().finally(() => {
      this.running = null;
      if (this.pending.size > 0) this.ensureRunning();
    });
  }

  // A request that was never queued has no answer to wait for.
  cancel(requestId) {
    this.settle(requestId, null);
  }

  settle(requestId, answer) {
    const waiter = this.pending.get(requestId);
    if (!waiter) return; // an answer no longer awaited is ours to drop
    this.pending.delete(requestId);
    waiter.resolve(answer);
  }

  async run() {
    try {
      while (this.pending.size > 0 && !this.closed) {
        this.expire();
        if (this.pending.size === 0) break;
        await this.lookUnderOwnKeys();
        await this.readChannels();
      }
    } catch (err) {
      // The store failed us: every waiter hears it rather than waiting out its deadline.
      for (const waiter of this.pending.values()) waiter.reject(err);
      this.pending.clear();
    }
  }

  expire() {
    const now = Date.now();
    for (const [id, waiter] of this.pending) if (waiter.deadlineMs <= now) this.settle(id, null);
  }

  async lookUnderOwnKeys() {
    const now = Date.now();
    const due = [...this.pending].filter(([, w]) => now - w.sentAt >= w.nextLookMs);
    if (due.length === 0) return;
    const pipeline = this.redis.pipeline();
    for (const [id, waiter] of due) {
      pipeline.lpopBuffer(resultKey(waiter.caller, id));
      waiter.nextLookMs *= 2;
    }
    const replies = await pipeline.exec();
    due.forEach(([id], i) => {
      const [err, bytes] = replies[i];
      if (!err && bytes) this.settle(id, { bytes, via: 'key' });
    });
  }

  async readChannels() {
    const keys = [...new Set([...this.pending.values()].map((w) => replyKey(w.caller, this.channel)))];
    const block = Math.max(0.01, Math.min(LONGEST_BLOCK_S, this.secondsToNextEvent()));
    const reply = await this.reader.callBuffer(
      'BLMPOP', block.toFixed(3), keys.length, ...keys, 'LEFT', 'COUNT', ANSWERS_PER_READ);
    if (!reply) return;
    for (const bytes of reply[1]) {
      let requestId;
      try {
        requestId = this.decodeRequestId(bytes);
      } catch (err) {
        console.error(`dropped an undecodable answer on ${reply[0]}: ${err.message}`);
        continue;
      }
      this.settle(requestId, { bytes, via: 'channel' });
    }
  }

  secondsToNextEvent() {
    const now = Date.now();
    let next = Infinity;
    for (const w of this.pending.values()) next = Math.min(next, w.deadlineMs, w.sentAt + w.nextLookMs);
    return (next - now) / 1000;
  }

  async close() {
    this.closed = true;
    for (const id of [...this.pending.keys()]) this.settle(id, null);
    if (this.running) await this.running.catch(() => {});
    await this.reader.quit().catch(() => this.reader.disconnect());
  }
}

module.exports = { resultKey, replyKey, ResultWaiter, ReplyReader };
