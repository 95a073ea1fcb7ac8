'use strict';
// Publishing on Redis: one FCALL ds_publish_v2, which builds the Celery message, runs
// admission and queues it in one atomic step (docs/protocol.md, "Publishing on Redis").
const { publishArgs } = require('./envelope');

// The workers load the function and write its configuration when they start; until one has
// (or while workers of two versions share the server), the call fails this way and the
// documented remedy is to retry after 0.5 s.
const NOT_READY = /^(ERR )?(dataservice: not configured|Function not found|dataservice: ds:conf holds a lane of another version)/;
const NOT_READY_RETRY_MS = 500;

class RedisBroker {
  constructor(redis) {
    this.redis = redis;
  }

  // Resolves to { queued: true, epoch, leased } or { queued: false, reason, retryAfterMs }.
  // Throws for an argument the function rejects (`dataservice: <what>`): nothing was queued.
  async publish(prepared) {
    let answer;
    try {
      answer = await this.redis.call('FCALL', 'ds_publish_v2', '0', ...publishArgs(prepared));
    } catch (err) {
      if (NOT_READY.test(err.message)) {
        return { queued: false, code: 'UNAVAILABLE', reason: 'not_configured', retryAfterMs: NOT_READY_RETRY_MS };
      }
      throw err;
    }
    const [reason, second, leased] = answer;
    if (reason === '') return { queued: true, epoch: String(second), leased: Number(leased) };
    return { queued: false, code: 'RESOURCE_EXHAUSTED', reason, retryAfterMs: Number(second) };
  }

  async close() {}
}

module.exports = { RedisBroker };
