// Loading Leasehold's protos and converting between JavaScript values and
// google.protobuf.Struct. The .proto files are read from the repository's
// protos/ directory, never copied, so the example always matches the API.
"use strict";

const fs = require("node:fs");
const path = require("node:path");
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

const PROTOS = path.resolve(__dirname, "..", "..", "protos");

function loadLeasehold() {
  const definition = protoLoader.loadSync(
    ["leasehold/v1/jobs.proto", "leasehold/v1/worker.proto"],
    { includeDirs: [PROTOS], longs: String, enums: String, defaults: true, oneofs: true },
  );
  return grpc.loadPackageDefinition(definition).leasehold.v1;
}

// Plaintext by default; TLS when LEASEHOLD_TLS_CA names the PEM file of the CA
// that signed the server's certificate (serve --tls-cert).
function channelCredentials() {
  const ca = process.env.LEASEHOLD_TLS_CA;
  return ca ? grpc.credentials.createSsl(fs.readFileSync(ca)) : grpc.credentials.createInsecure();
}

// A JSON value as a google.protobuf.Value, and back.
function toValue(value) {
  if (value === null || value === undefined) return { nullValue: "NULL_VALUE" };
  if (typeof value === "number") return { numberValue: value };
  if (typeof value === "string") return { stringValue: value };
  if (typeof value === "boolean") return { boolValue: value };
  if (Array.isArray(value)) return { listValue: { values: value.map(toValue) } };
  return { structValue: toStruct(value) };
}

function toStruct(object) {
  const fields = {};
  for (const [key, value] of Object.entries(object || {})) fields[key] = toValue(value);
  return { fields };
}

function fromValue(value) {
  switch (value.kind) {
    case "numberValue": return value.numberValue;
    case "stringValue": return value.stringValue;
    case "boolValue": return value.boolValue;
    case "listValue": return (value.listValue.values || []).map(fromValue);
    case "structValue": return fromStruct(value.structValue);
    default: return null;
  }
}

function fromStruct(struct) {
  const object = {};
  for (const [key, value] of Object.entries((struct && struct.fields) || {})) object[key] = fromValue(value);
  return object;
}

module.exports = { grpc, channelCredentials, loadLeasehold, toStruct, fromStruct };
