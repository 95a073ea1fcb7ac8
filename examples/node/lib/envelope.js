'use strict';
// Building, signing and wrapping one request (docs/protocol.md, "Writing a caller", steps 1-3).
const crypto = require('node:crypto');
const { encodeEnvelope, encodeSignedRequest } = require('./proto');

const OPERATIONS = ['read', 'write', 'delete', 'list', 'batch', 'read_many'];

// 32 hex digits: within the request id's rule [A-Za-z0-9_-]{1,64}.
const newRequestId = () => crypto.randomBytes(16).toString('hex');

function operationOf(envelope) {
  const names = OPERATIONS.filter((name) => envelope[name] != null);
  if (names.length !== 1) throw new Error(`an envelope carries exactly one operation, not ${names.length}`);
  return names[0];
}

// How many operations a message carries: admission and max_ops_per_message count these.
function opsOf(envelope) {
  if (envelope.batch) return envelope.batch.operations.length;
  if (envelope.read_many) return envelope.read_many.reads.length;
  return 1;
}

function sign(envelopeBytes, secret) {
  return crypto.createHmac('sha256', secret).update(envelopeBytes).digest();
}

// tamper: '' (a proper request), 'signature' (flip the lowest bit of the signature's first
// byte) or 'unsigned' (the envelope alone); the last two exist to test the service.
function wrap(envelopeBytes, keyId, secret, tamper = '') {
  if (tamper === 'unsigned') return encodeSignedRequest({ envelope: envelopeBytes });
  const signature = sign(envelopeBytes, secret);
  if (tamper === 'signature') signature[0] ^= 1;
  else if (tamper) throw new Error(`unknown tamper mode ${tamper}`);
  return encodeSignedRequest({ envelope: envelopeBytes, key_id: keyId, signature });
}

// The arguments of FCALL ds_publish_v2 after its "0" (no keys), in the documented order.
function publishArgs(prepared) {
  return [
    prepared.lane,
    prepared.requestId,
    prepared.caller,
    String(prepared.deadlineMs),
    prepared.operation,
    String(prepared.ops),
    prepared.signedRequest.toString('base64'),
  ];
}

// Everything a broker needs to publish one request. The envelope is serialized once and those
// very bytes are signed: protobuf may serialize one message in more than one valid way.
function prepare({ lane, envelope, keyId, secret, tamper = '' }) {
  const envelopeBytes = encodeEnvelope(envelope);
  const signedRequest = wrap(envelopeBytes, keyId, secret, tamper);
  return {
    lane,
    requestId: envelope.request_id,
    caller: envelope.caller,
    deadlineMs: Number(envelope.deadline_unix_ms),
    operation: operationOf(envelope),
    ops: opsOf(envelope),
    envelopeBytes,
    signedRequest,
  };
}

module.exports = { newRequestId, operationOf, opsOf, sign, wrap, publishArgs, prepare };
