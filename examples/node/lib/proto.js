'use strict';
// The access.v2 schema, loaded at run time from the repository's own .proto so that
// this caller can never drift from the service's wire format.
const path = require('node:path');
const protobuf = require('protobufjs');

const PROTO_PATH = path.join(
  __dirname, '..', '..', '..', 'dataservice', 'proto', 'access', 'v2', 'access.proto');

const root = new protobuf.Root();
// keepCase: field names stay as the .proto and docs spell them (request_id, not requestId).
root.loadSync(PROTO_PATH, { keepCase: true });

const RequestEnvelope = root.lookupType('access.v2.RequestEnvelope');
const SignedRequest = root.lookupType('access.v2.SignedRequest');
const ResponseEnvelope = root.lookupType('access.v2.ResponseEnvelope');

// Plain objects for programs: numbers for int64s (revisions and Unix ms fit in 2^53),
// enum names, payloads as Buffers.
const NATIVE = { longs: Number, enums: String, bytes: Buffer };
// The proto3 JSON mapping with the .proto's field names, as vectors.json writes answers.
const JSON_MAPPING = { longs: String, enums: String, bytes: String };

function encode(type, fields) {
  const message = type.fromObject(fields);
  const problem = type.verify(message);
  if (problem) throw new Error(`${type.name}: ${problem}`);
  return Buffer.from(type.encode(message).finish());
}

const encodeEnvelope = (fields) => encode(RequestEnvelope, fields);
const encodeSignedRequest = (fields) => encode(SignedRequest, fields);

function decodeResponse(bytes, mapping = NATIVE) {
  return ResponseEnvelope.toObject(ResponseEnvelope.decode(bytes), mapping);
}

module.exports = {
  PROTO_PATH, RequestEnvelope, SignedRequest, ResponseEnvelope,
  NATIVE, JSON_MAPPING, encodeEnvelope, encodeSignedRequest, decodeResponse,
};
