'use strict';
// The library against the golden vectors (dataservice/proto/access/v2/vectors.json): the same
// inputs must give the same bytes, signatures and publish arguments as the service's own client.
const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const {
  RequestEnvelope, SignedRequest, JSON_MAPPING, encodeEnvelope, decodeResponse,
  sign, prepare, publishArgs, RedisBroker, statusName,
} = require('../lib');

const vectors = require(path.join(__dirname, '..', '..', '..', 'dataservice', 'proto', 'access', 'v2', 'vectors.json'));
const secret = Buffer.from(vectors.key.secret_hex, 'hex');
const keyId = vectors.key.key_id;

for (const vector of vectors.requests) {
  test(`request: ${vector.name}`, async (t) => {
    const envelopeBytes = encodeEnvelope(vector.envelope);

    await t.test('the envelope encodes to envelope_hex and decodes back', () => {
      assert.equal(envelopeBytes.toString('hex'), vector.envelope_hex);
      const decoded = RequestEnvelope.toObject(RequestEnvelope.decode(envelopeBytes), JSON_MAPPING);
      assert.deepEqual(decoded, vector.envelope);
    });

    await t.test('the HMAC over the envelope bytes is signature_hex', () => {
      assert.equal(sign(envelopeBytes, secret).toString('hex'), vector.signature_hex);
    });

    const prepared = prepare({ lane: vector.lane, envelope: vector.envelope, keyId, secret });

    await t.test('the SignedRequest is signed_request_hex', () => {
      assert.equal(prepared.signedRequest.toString('hex'), vector.signed_request_hex);
    });

    await t.test('the ds_publish_v2 arguments are publish_args', () => {
      assert.deepEqual(publishArgs(prepared), vector.publish_args);
    });
  });
}

for (const vector of vectors.answers) {
  test(`answer: ${vector.name}`, () => {
    const decoded = decodeResponse(Buffer.from(vector.response_hex, 'hex'), JSON_MAPPING);
    assert.deepEqual(decoded, vector.response);
  });
}

for (const vector of vectors.publish_answers) {
  test(`publish answer: ${vector.name}`, async () => {
    const redis = { call: async () => vector.answer };
    const outcome = await new RedisBroker(redis).publish(
      prepare({ ...vectors.requests[0], keyId, secret }));
    const [reason, second, leased] = vector.answer;
    if (reason === '') {
      assert.deepEqual(outcome, { queued: true, epoch: second, leased });
    } else {
      assert.deepEqual(outcome, { queued: false, code: 'RESOURCE_EXHAUSTED', reason, retryAfterMs: second });
    }
  });
}

test('the tamper modes change only what they say', () => {
  const vector = vectors.requests[0];
  const flipped = SignedRequest.decode(
    prepare({ lane: vector.lane, envelope: vector.envelope, keyId, secret, tamper: 'signature' }).signedRequest);
  const expected = Buffer.from(vector.signature_hex, 'hex');
  expected[0] ^= 1;
  assert.equal(Buffer.from(flipped.signature).toString('hex'), expected.toString('hex'));

  const unsigned = SignedRequest.decode(
    prepare({ lane: vector.lane, envelope: vector.envelope, keyId, secret, tamper: 'unsigned' }).signedRequest);
  assert.equal(Buffer.from(unsigned.envelope).toString('hex'), vector.envelope_hex);
  assert.equal(unsigned.key_id, '');
  assert.equal(unsigned.signature.length, 0);
});

test('base64 is RFC 4648 with padding', () => {
  assert.equal(Buffer.from([0x00, 0xff]).toString('base64'), vectors.base64_of_signed_request.split(': ')[1]);
});

test('status codes 0 and unknown ones read as INTERNAL', () => {
  assert.equal(statusName('STATUS_CODE_CONFLICT'), 'CONFLICT');
  assert.equal(statusName('STATUS_CODE_UNSPECIFIED'), 'INTERNAL');
  assert.equal(statusName(42), 'INTERNAL');
});
