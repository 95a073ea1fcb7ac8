#!/usr/bin/env node
'use strict';
// The conformance program (docs/conformance.md): reads a hello line and then call lines on
// standard input, answers each call with one result line on standard output. Calls run
// concurrently, so results may come out of order. Diagnostics go to standard error only.
const readline = require('node:readline');
const Redis = require('ioredis');
const { Client, RedisBroker, AmqpBroker, statusName } = require('./lib');

const NAME = 'dataservice-node-caller (ioredis, amqplib, protobufjs)';
const READ_MODES = { allow_cached: 'READ_MODE_ALLOW_CACHED', primary: 'READ_MODE_PRIMARY' };

const send = (message) => process.stdout.write(`${JSON.stringify(message)}\n`);
const log = (...args) => console.error('[node-caller]', ...args);

// The service's own lane deadlines, which the hello carries.
function lanesOf(hello) {
  const lanes = {};
  for (const [name, lane] of Object.entries(hello.lanes)) {
    lanes[name] = { defaultMs: lane.default_deadline_ms, longestMs: lane.max_deadline_ms };
  }
  return lanes;
}

async function connect(hello) {
  const results = new Redis(hello.results_url, { lazyConnect: true });
  results.on('error', (err) => log('results Redis:', err.message));
  try {
    await results.connect();
    const broker = hello.broker === 'rabbitmq'
      ? await AmqpBroker.connect(hello.broker_url, hello.lanes)
      : new RedisBroker(results);
    return { results, broker, client: new Client({ broker, results, lanes: lanesOf(hello) }) };
  } catch (err) {
    results.disconnect(); // ioredis would otherwise keep reconnecting, and keep us alive
    throw err;
  }
}

// --- from the interface's call fields to access.v2 operations ---

function readOf(spec) {
  const mode = READ_MODES[spec.mode];
  if (!mode) throw new Error(`unknown read mode ${JSON.stringify(spec.mode)}`);
  return { scope: spec.scope, object_id: spec.object_id, mode };
}

function writeOf(spec) {
  return {
    scope: spec.scope,
    object_id: spec.object_id,
    payload: Buffer.from(spec.payload_b64 ?? '', 'base64'),
    expected_revision: spec.expected_revision ?? 0,
  };
}

function deleteOf(spec) {
  return { scope: spec.scope, object_id: spec.object_id, expected_revision: spec.expected_revision ?? 0 };
}

function operationOf(call) {
  switch (call.op) {
    case 'read': return { read: readOf(call) };
    case 'write': return { write: writeOf(call) };
    case 'delete': return { delete: deleteOf(call) };
    case 'list': return { list: { scope: call.scope, page_size: call.page_size ?? 0, cursor: call.cursor ?? '' } };
    case 'read_many': return { read_many: { reads: call.reads.map(readOf) } };
    case 'batch':
      return {
        batch: {
          operations: call.operations.map((op) => {
            if (op.op === 'write') return { idempotency_key: op.idempotency_key, write: writeOf(op) };
            if (op.op === 'delete') return { idempotency_key: op.idempotency_key, delete: deleteOf(op) };
            throw new Error(`a batch carries writes and deletes, not ${op.op}`);
          }),
        },
      };
    default: throw new Error(`unknown op ${JSON.stringify(call.op)}`);
  }
}

// --- from access.v2 answers to the interface's results ---

function recordOf(record) {
  return {
    object_id: record.object_id ?? '',
    revision: record.revision ?? 0,
    payload_b64: (record.payload ?? Buffer.alloc(0)).toString('base64'),
    updated_at_unix_ms: record.updated_at_unix_ms ?? 0,
  };
}

function statusOf(status = {}) {
  return { status: statusName(status.code), reason: status.reason ?? '' };
}

// The result of one answered operation, by its kind (a batch operation's answers as well).
function resultOf(response) {
  if (response.read) return { record: recordOf(response.read.record ?? {}) };
  if (response.write) {
    const w = response.write;
    return { object_id: w.object_id ?? '', revision: w.revision ?? 0, created: w.created ?? false };
  }
  if (response.delete) return { object_id: response.delete.object_id ?? '', revision: response.delete.revision ?? 0 };
  if (response.list) {
    return { records: (response.list.records ?? []).map(recordOf), next_cursor: response.list.next_cursor ?? '' };
  }
  if (response.read_many) {
    return {
      results: (response.read_many.results ?? []).map((r) => {
        const item = statusOf(r.status);
        if (item.status === 'OK') item.record = recordOf(r.record ?? {});
        return item;
      }),
    };
  }
  return {};
}

// A batch's answers come under each operation's own request id; put them back in the order of
// the operations. An operation dropped as late has no answer.
function batchResultOf(response, envelope) {
  const byId = new Map((response.batch?.answers ?? []).map((a) => [a.request_id, a]));
  return {
    answers: envelope.batch.operations.map((op) => {
      const answer = byId.get(op.request_id);
      if (!answer) return { status: 'DEADLINE_EXCEEDED', reason: '' };
      const item = statusOf(answer.status);
      if (item.status === 'OK') item.result = resultOf(answer);
      return item;
    }),
  };
}

async function handle(client, call) {
  const outcome = await client.call({
    caller: call.caller,
    keyId: call.key_id,
    secret: Buffer.from(call.secret_hex, 'hex'),
    lane: call.op === 'batch' ? 'batch' : call.lane,
    timeoutMs: call.timeout_ms,
    retry: Boolean(call.retry),
    replyChannel: Boolean(call.reply_channel),
    tamper: call.tamper ?? '',
    operation: operationOf(call),
    idempotencyKey: call.op === 'write' || call.op === 'delete' ? call.idempotency_key : undefined,
  });
  const result = {
    type: 'result',
    id: call.id,
    status: outcome.status,
    reason: outcome.reason,
    retry_after_ms: outcome.retryAfterMs,
    attempts: outcome.attempts,
    reply_channel: outcome.replyChannel,
  };
  if (outcome.status === 'OK') {
    result.result = call.op === 'batch'
      ? batchResultOf(outcome.response, outcome.envelope)
      : resultOf(outcome.response);
  }
  if (outcome.replay) result.replay = { status: outcome.replay.status };
  return result;
}

async function main() {
  const lines = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
  let connecting = null;
  const inFlight = new Set();
  for await (const line of lines) {
    if (!line.trim()) continue;
    let message;
    try {
      message = JSON.parse(line);
    } catch (err) {
      log('not a JSON line:', err.message);
      continue;
    }
    if (message.type === 'hello') {
      // A caller that cannot connect still says ready, and answers every call ERROR.
      connecting = connect(message);
      await connecting.catch((err) => log('could not connect:', err.message));
      send({ type: 'ready', name: NAME });
    } else if (message.type === 'call') {
      const running = (connecting ?? Promise.reject(new Error('a call before the hello')))
        .then((connection) => handle(connection.client, message))
        .catch((err) => {
          log(`call ${message.id}:`, err.stack || err.message);
          return { type: 'result', id: message.id, status: 'ERROR', message: err.message,
            reason: '', retry_after_ms: 0, attempts: 0, reply_channel: '' };
        })
        .then(send);
      inFlight.add(running);
      running.finally(() => inFlight.delete(running));
    } else {
      log('ignored a line of type', message.type);
    }
  }
  // Standard input closed: finish the calls under way, then let go of the connections.
  await Promise.allSettled([...inFlight]);
  const connection = await connecting?.catch(() => null);
  if (connection) {
    await connection.client.close();
    await connection.broker.close();
    await connection.results.quit();
  }
}

main().catch((err) => {
  log('fatal:', err.stack || err.message);
  process.exitCode = 1;
});
