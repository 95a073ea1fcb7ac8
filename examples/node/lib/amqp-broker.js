'use strict';
// Publishing on RabbitMQ: the SignedRequest bytes as the body of a Celery (protocol 2) task
// message, to the lane's direct exchange with its queue as routing key, and wait for the
// broker's confirm (docs/protocol.md, "How requests travel").
const amqp = require('amqplib');

const TASK_NAME = 'dataservice.handle';
// A nack carries no retry-after: the one docs/protocol.md gives for it.
const NACK_RETRY_MS = 200;
// A broker that cannot be reached: the Python clients' retry-after for it.
const UNREACHABLE_RETRY_MS = 500;

// The task message's headers: Celery's protocol 2 headers, as the service's own publisher
// writes them, plus the ds_* headers that admission and the workers read.
function taskHeaders(prepared) {
  const id = prepared.requestId;
  const headers = {
    lang: 'js',
    task: TASK_NAME,
    id,
    shadow: null,
    eta: null,
    expires: null, // deliberately unset: the handler drops late requests itself
    group: null,
    group_index: null,
    retries: 0,
    timelimit: [null, null],
    root_id: id,
    parent_id: null,
    argsrepr: `<RequestEnvelope ${prepared.envelopeBytes.length} bytes>`,
    kwargsrepr: '{}',
    origin: `${prepared.caller}@dataservice-node-caller`,
    ignore_result: true,
    ds_deadline_ms: prepared.deadlineMs,
    ds_caller: prepared.caller,
    ds_op: prepared.operation,
  };
  if (prepared.ops > 1) headers.ds_ops = prepared.ops;
  return headers;
}

class AmqpBroker {
  // lanes: { <lane>: { queue, exchange } }, as the conformance hello gives them.
  constructor(connection, channel, lanes) {
    this.connection = connection;
    this.channel = channel;
    this.lanes = lanes;
  }

  static async connect(url, lanes) {
    const connection = await amqp.connect(url);
    const channel = await connection.createConfirmChannel();
    return new AmqpBroker(connection, channel, lanes);
  }

  // Resolves to { queued: true } once RabbitMQ confirms; a nack (the queue at its bound,
  // reject-publish) is the refusal the service's own clients report as queue_full.
  publish(prepared) {
    const lane = this.lanes[prepared.lane];
    if (!lane) throw new Error(`unknown lane ${prepared.lane}`);
    const timeLeft = prepared.deadlineMs - Date.now();
    const options = {
      contentType: 'application/x-protobuf',
      contentEncoding: 'binary',
      correlationId: prepared.requestId,
      deliveryMode: 2,
      priority: 0,
      // RabbitMQ drops the message unseen once its deadline has passed.
      expiration: String(Math.max(timeLeft, 1)),
      headers: taskHeaders(prepared),
    };
    return new Promise((resolve) => {
      this.channel.publish(lane.exchange, lane.queue, prepared.signedRequest, options, (err) => {
        if (!err) resolve({ queued: true });
        // amqplib's error for a nack; any other (the channel closed) leaves the publish unknown.
        else if (err.message === 'message nacked') {
          resolve({ queued: false, code: 'RESOURCE_EXHAUSTED', reason: 'queue_full', retryAfterMs: NACK_RETRY_MS });
        } else resolve({ queued: false, code: 'UNAVAILABLE', reason: '', retryAfterMs: UNREACHABLE_RETRY_MS });
      });
    });
  }

  async close() {
    await this.channel.close();
    await this.connection.close();
  }
}

module.exports = { AmqpBroker };
