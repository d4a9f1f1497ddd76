// Reads a GGUF file with @huggingface/gguf, a parser written independently
// of nabla, and prints what it sees as JSON: the header counts, each metadata
// value with its GGUF type name, each tensor's info as the parser reports it
// (shape in ggml order, innermost first), and the tensor's values, read from
// the data offset the parser computed.
// Usage: node read.mjs FILE.gguf
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { gguf, GGUFValueType, GGMLQuantizationType } from "@huggingface/gguf";

const path = resolve(process.argv[2]);
const { metadata, typedMetadata, tensorInfos, tensorDataOffset } = await gguf(path, {
  allowLocalFile: true,
  typedMetadata: true,
});

// BigInt has no JSON form; counts and u64/i64 values here fit a double.
const num = (v) => {
  if (typeof v !== "bigint") return v;
  if (v > BigInt(Number.MAX_SAFE_INTEGER) || v < BigInt(Number.MIN_SAFE_INTEGER)) {
    throw new Error(`value ${v} does not fit a double`);
  }
  return Number(v);
};
const plain = (v) => (Array.isArray(v) ? v.map(plain) : num(v));

const header = { version: metadata.version, tensor_count: num(metadata.tensor_count), kv_count: num(metadata.kv_count) };
const values = {};
for (const [key, entry] of Object.entries(typedMetadata)) {
  if (key in header) continue;
  values[key] = { type: GGUFValueType[entry.type], value: plain(entry.value) };
  if (entry.subType !== undefined) values[key].subType = GGUFValueType[entry.subType];
}

const bytes = readFileSync(path);
const views = { F32: [Float32Array, 4], F64: [Float64Array, 8], I32: [Int32Array, 4] };
const tensors = tensorInfos.map((t) => {
  const dtype = GGMLQuantizationType[t.dtype];
  const count = t.shape.reduce((a, d) => a * Number(d), 1);
  const info = { name: t.name, n_dims: t.n_dims, shape: t.shape.map(num), dtype, offset: num(t.offset) };
  if (views[dtype]) {
    const [View, size] = views[dtype];
    const start = Number(tensorDataOffset + t.offset);
    const copy = bytes.buffer.slice(bytes.byteOffset + start, bytes.byteOffset + start + count * size);
    info.data = Array.from(new View(copy));
  }
  return info;
});

console.log(JSON.stringify({ header, tensorDataOffset: num(tensorDataOffset), metadata: values, tensors }, null, 2));
