'use strict';
// One call from key to answer: build, sign, publish, wait, decode, and retry the retryable
// codes within the deadline (docs/protocol.md, "Writing a caller").
const { newRequestId, prepare } = require('./envelope');
const { decodeResponse, ResponseEnvelope } = require('./proto');
const { ResultWaiter, ReplyReader } = require('./answers');

// Each lane's default and longest deadline: a deadline further than `longestMs` after issue is
// refused. These are queues.yml's defaults; a deployment's own come with its configuration.
const DEFAULT_LANES = {
  interactive: { defaultMs: 2000, longestMs: 30000 },
  batch: { defaultMs: 300000, longestMs: 3600000 },
};
const RETRYABLE = new Set(['RESOURCE_EXHAUSTED', 'UNAVAILABLE']);
// A retry-after of 0 (or none) still waits this long, so a retry is never a busy loop.
const MIN_RETRY_MS = 10;

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// 'STATUS_CODE_NOT_FOUND' -> 'NOT_FOUND'; 0 and codes this schema does not know are INTERNAL.
function statusName(code) {
  if (typeof code !== 'string' || code === 'STATUS_CODE_UNSPECIFIED') return 'INTERNAL';
  return code.replace(/^STATUS_CODE_/, '');
}

function requestIdOf(bytes) {
  return ResponseEnvelope.decode(bytes).request_id;
}

class Client {
  // broker: a RedisBroker or AmqpBroker; results: an ioredis connection to the result store.
  constructor({ broker, results, lanes = DEFAULT_LANES }) {
    this.broker = broker;
    this.lanes = lanes;
    this.results = new ResultWaiter(results);
    this.replies = new ReplyReader(results, requestIdOf);
  }

  // request: { caller, keyId, secret, lane, timeoutMs, retry, replyChannel, tamper, operation,
  // idempotencyKey }. operation is one RequestEnvelope operation, e.g. { read: { ... } }; a
  // batch's operations need no request_id or deadline: each attempt gives them fresh ones.
  // Resolves to { status, reason, retryAfterMs, attempts, replyChannel, response, envelope,
  // replay }: response is the decoded ResponseEnvelope (null without one), envelope the last
  // one sent, replay the outcome of the copy sent again when tamper is 'replay'.
  async call(request) {
    const lane = this.lanes[request.lane];
    if (!lane) throw new Error(`unknown lane ${request.lane}`);
    const timeoutMs = Math.min(request.timeoutMs ?? lane.defaultMs, lane.longestMs);
    const deadlineMs = Date.now() + timeoutMs;
    const tamper = request.tamper ?? '';
    let attempts = 0;
    for (;;) {
      const envelope = this.envelope(request, deadlineMs);
      const prepared = prepare({
        lane: request.lane, envelope, keyId: request.keyId, secret: request.secret,
        tamper: tamper === 'replay' ? '' : tamper,
      });
      attempts += 1;
      const outcome = await this.attempt(prepared, request.replyChannel);
      const again = request.retry && RETRYABLE.has(outcome.status);
      const pause = Math.max(outcome.retryAfterMs, MIN_RETRY_MS);
      if (again && Date.now() + pause < deadlineMs) {
        await sleep(pause);
        continue;
      }
      const result = { ...outcome, attempts, envelope };
      if (tamper === 'replay') result.replay = await this.attempt(prepared, request.replyChannel);
      return result;
    }
  }

  envelope(request, deadlineMs) {
    const now = Date.now();
    const envelope = {
      caller: request.caller,
      request_id: newRequestId(),
      deadline_unix_ms: deadlineMs,
      issued_at_unix_ms: now,
      ...request.operation,
    };
    if (request.idempotencyKey) envelope.idempotency_key = request.idempotencyKey;
    if (request.replyChannel) envelope.reply_channel = this.replies.channel;
    if (envelope.batch) {
      // Each operation keeps its idempotency key across attempts and gets a new request id.
      envelope.batch = {
        operations: envelope.batch.operations.map((op) => ({
          ...op, request_id: newRequestId(), deadline_unix_ms: deadlineMs,
        })),
      };
    }
    return envelope;
  }

  // Publishes one prepared request and waits for its answer until its deadline.
  async attempt(prepared, onReplyChannel) {
    const { caller, requestId, deadlineMs } = prepared;
    const waiting = onReplyChannel
      ? this.replies.wait(caller, requestId, deadlineMs)
      : null;
    // Its failure is awaited below; until then it must not count as an unhandled rejection.
    waiting?.catch(() => {});
    let published;
    try {
      published = await this.broker.publish(prepared);
    } catch (err) {
      if (waiting) this.replies.cancel(requestId);
      throw err;
    }
    if (!published.queued) {
      if (waiting) this.replies.cancel(requestId);
      return answerless(published.code, published.reason, published.retryAfterMs);
    }
    const answer = onReplyChannel
      ? await waiting
      : await this.results.wait(caller, requestId, deadlineMs).then((bytes) => bytes && { bytes, via: 'key' });
    if (!answer) return answerless('DEADLINE_EXCEEDED', '', 0);
    const response = decodeResponse(answer.bytes);
    const status = response.status ?? {};
    return {
      status: statusName(status.code),
      reason: status.reason ?? '',
      retryAfterMs: status.retry_after_ms ?? 0,
      replyChannel: answer.via === 'channel' ? this.replies.channel : '',
      response,
    };
  }

  async close() {
    await this.replies.close();
    await this.results.close();
  }
}

function answerless(status, reason, retryAfterMs) {
  return { status, reason: reason ?? '', retryAfterMs: retryAfterMs ?? 0, replyChannel: '', response: null };
}

module.exports = { Client, DEFAULT_LANES, statusName };
