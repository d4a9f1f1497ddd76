// Checks a GPT-2 checkpoint exported by `nabla export gguf` against the
// conventions of llama.cpp's gpt2 architecture, reading the GGUF file with
// @huggingface/gguf and the source checkpoint (safetensors) with a parser
// written here, so that neither side goes through nabla's code:
//   - general.* and gpt2.* keys with llama.cpp's types, from the checkpoint's
//     nabla.config;
//   - tensor names, order, ggml shapes (innermost first) and every value,
//     with the Conv1D weights [in, out] transposed to Linear layout;
//   - the tokenizer: model "gpt2", pre-tokenizer "gpt-2", tokens, INT32 token
//     types, merges, BOS/EOS/EOT. For the byte tokenizer the tokens are GPT-2's
//     byte alphabet; for GPT-2's BPE they are encoder.json's and the merges
//     vocab.bpe's, read from VOCAB_DIR.
// Usage: node check_gpt2.mjs MODEL.gguf CHECKPOINT.safetensors [VOCAB_DIR]
import { readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { gguf, GGUFValueType, GGMLQuantizationType } from "@huggingface/gguf";

const [ggufPath, stPath, vocabDir] = process.argv.slice(2).map((p) => p && resolve(p));
const failures = [];
const check = (ok, what) => {
  if (!ok) failures.push(what);
};
const show = (v) => JSON.stringify(v, (_, x) => (typeof x === "bigint" ? `${x}n` : x));

// ---- The checkpoint: u64 header length, JSON header, data.
const st = readFileSync(stPath);
const headerLength = Number(st.readBigUInt64LE(0));
const stHeader = JSON.parse(st.subarray(8, 8 + headerLength).toString("utf8"));
const cfg = JSON.parse(stHeader.__metadata__["nabla.config"]);
const source = (name) => {
  const info = stHeader[name];
  if (!info) throw new Error(`${stPath}: no tensor ${name}`);
  if (info.dtype !== "F32") throw new Error(`${stPath}: ${name} is ${info.dtype}, expected F32`);
  const [begin, end] = info.data_offsets;
  const start = 8 + headerLength + begin;
  return { shape: info.shape, data: new Float32Array(st.buffer.slice(st.byteOffset + start, st.byteOffset + 8 + headerLength + end)) };
};

// ---- The GGUF file.
const { typedMetadata, tensorInfos, tensorDataOffset } = await gguf(ggufPath, { allowLocalFile: true, typedMetadata: true });
const bytes = readFileSync(ggufPath);

const D = cfg.n_embd, F = 4 * cfg.n_embd, V = cfg.vocab_size, P = cfg.n_positions, L = cfg.n_layer;
const expectValue = (key, type, value) => {
  const e = typedMetadata[key];
  check(e !== undefined, `missing key ${key}`);
  if (!e) return;
  check(GGUFValueType[e.type] === type, `${key}: type ${GGUFValueType[e.type]}, expected ${type}`);
  const got = typeof e.value === "bigint" ? Number(e.value) : e.value;
  check(got === value, `${key}: ${show(got)}, expected ${show(value)}`);
};
expectValue("general.architecture", "STRING", "gpt2");
expectValue("general.name", "STRING", cfg.preset || "gpt2");
expectValue("general.file_type", "UINT32", 0);
expectValue("gpt2.context_length", "UINT32", P);
expectValue("gpt2.embedding_length", "UINT32", D);
expectValue("gpt2.feed_forward_length", "UINT32", F);
expectValue("gpt2.block_count", "UINT32", L);
expectValue("gpt2.attention.head_count", "UINT32", cfg.n_head);
expectValue("gpt2.attention.layer_norm_epsilon", "FLOAT32", Math.fround(cfg.layer_norm_epsilon));

// ---- Tensors: llama.cpp name -> [Hugging Face name, transposed?, ggml shape].
const expected = [
  ["token_embd.weight", "wte.weight", false, [D, V]],
  ["position_embd.weight", "wpe.weight", false, [D, P]],
];
for (let i = 0; i < L; ++i) {
  const b = `blk.${i}.`, h = `h.${i}.`;
  expected.push(
    [b + "attn_norm.weight", h + "ln_1.weight", false, [D]],
    [b + "attn_norm.bias", h + "ln_1.bias", false, [D]],
    [b + "attn_qkv.weight", h + "attn.c_attn.weight", true, [D, 3 * D]],
    [b + "attn_qkv.bias", h + "attn.c_attn.bias", false, [3 * D]],
    [b + "attn_output.weight", h + "attn.c_proj.weight", true, [D, D]],
    [b + "attn_output.bias", h + "attn.c_proj.bias", false, [D]],
    [b + "ffn_norm.weight", h + "ln_2.weight", false, [D]],
    [b + "ffn_norm.bias", h + "ln_2.bias", false, [D]],
    [b + "ffn_up.weight", h + "mlp.c_fc.weight", true, [D, F]],
    [b + "ffn_up.bias", h + "mlp.c_fc.bias", false, [F]],
    [b + "ffn_down.weight", h + "mlp.c_proj.weight", true, [F, D]],
    [b + "ffn_down.bias", h + "mlp.c_proj.bias", false, [D]],
  );
}
expected.push(["output_norm.weight", "ln_f.weight", false, [D]], ["output_norm.bias", "ln_f.bias", false, [D]]);

const names = tensorInfos.map((t) => t.name);
check(show(names) === show(expected.map((e) => e[0])), `tensor names ${show(names)}\n  expected ${show(expected.map((e) => e[0]))}`);
let values = 0;
for (const [name, hf, transpose, shape] of expected) {
  const t = tensorInfos.find((x) => x.name === name);
  if (!t) continue;
  const dims = t.shape.map(Number);
  check(show(dims) === show(shape), `${name}: ggml shape ${show(dims)}, expected ${show(shape)}`);
  check(GGMLQuantizationType[t.dtype] === "F32", `${name}: ${GGMLQuantizationType[t.dtype]}, expected F32`);
  const count = dims.reduce((a, d) => a * d, 1);
  const start = Number(tensorDataOffset + t.offset);
  const got = new Float32Array(bytes.buffer.slice(bytes.byteOffset + start, bytes.byteOffset + start + 4 * count));
  const src = source(hf);
  check(src.data.length === count, `${name}: ${count} values, ${hf} has ${src.data.length}`);
  if (src.data.length !== count) continue;
  // Transposed: ggml element (ne0 = i, ne1 = o) of the Linear weight is the
  // Conv1D weight's [i][o]: got[o * in + i] == src[i * out + o].
  const [rows, cols] = src.shape;
  for (let k = 0; k < count; ++k) {
    const want = transpose ? src.data[(k % rows) * cols + Math.floor(k / rows)] : src.data[k];
    if (!Object.is(got[k], want)) {
      check(false, `${name}[${k}] = ${got[k]}, expected ${want} (from ${hf}${transpose ? ", transposed" : ""})`);
      break;
    }
  }
  values += count;
}
check(!names.includes("output.weight"), "output.weight present: GPT-2's head is tied to token_embd");

// ---- Tokenizer.
const array = (key, subType) => {
  const e = typedMetadata[key];
  check(e && GGUFValueType[e.type] === "ARRAY" && GGUFValueType[e.subType] === subType, `${key}: expected an array of ${subType}`);
  return e ? e.value : [];
};
expectValue("tokenizer.ggml.model", "STRING", "gpt2");
expectValue("tokenizer.ggml.pre", "STRING", "gpt-2");
const tokens = array("tokenizer.ggml.tokens", "STRING");
const types = array("tokenizer.ggml.token_type", "INT32");
const merges = array("tokenizer.ggml.merges", "STRING");
check(tokens.length === V, `${tokens.length} tokens, the checkpoint's vocab_size is ${V}`);
check(types.length === V, `${types.length} token types, expected ${V}`);

// GPT-2's bytes_to_unicode, written from its definition.
const byteChars = [];
for (let b = 0, next = 256; b < 256; ++b) {
  const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  byteChars.push(String.fromCodePoint(printable ? b : next++));
}
let wantTokens, wantMerges, wantTypes, special;
if (cfg.tokenizer === "byte") {
  wantTokens = byteChars;
  wantMerges = [];
  wantTypes = byteChars.map(() => 1);
  special = 10; // '\n', nabla's document separator
} else {
  const encoder = JSON.parse(readFileSync(join(vocabDir, "encoder.json"), "utf8"));
  wantTokens = [];
  for (const [token, id] of Object.entries(encoder)) wantTokens[id] = token;
  wantMerges = readFileSync(join(vocabDir, "vocab.bpe"), "utf8")
    .split("\n")
    .map((l) => l.replace(/\r$/, ""))
    .filter((l, i) => l !== "" && !(i === 0 && l.startsWith("#version")));
  special = encoder["<|endoftext|>"];
  wantTypes = wantTokens.map((_, id) => (id === special ? 3 : 1)); // CONTROL, NORMAL
}
for (let id = wantTokens.length; id < V; ++id) {
  wantTokens.push(`[PAD${id}]`);
  wantTypes.push(5); // UNUSED
}
const firstDiff = (a, b) => a.findIndex((x, i) => x !== b[i]);
check(firstDiff(tokens, wantTokens) < 0, `token ${firstDiff(tokens, wantTokens)} is ${show(tokens[firstDiff(tokens, wantTokens)])}, expected ${show(wantTokens[firstDiff(tokens, wantTokens)])}`);
check(firstDiff(types, wantTypes) < 0, `token type ${firstDiff(types, wantTypes)} differs`);
check(merges.length === wantMerges.length, `${merges.length} merges, expected ${wantMerges.length}`);
check(firstDiff(merges, wantMerges) < 0, `merge ${firstDiff(merges, wantMerges)} is ${show(merges[firstDiff(merges, wantMerges)])}`);
expectValue("tokenizer.ggml.bos_token_id", "UINT32", special);
expectValue("tokenizer.ggml.eos_token_id", "UINT32", special);
expectValue("tokenizer.ggml.eot_token_id", "UINT32", special);
expectValue("tokenizer.ggml.add_bos_token", "BOOL", false);

if (failures.length) {
  for (const f of failures) console.error(`FAIL: ${ggufPath}: ${f}`);
  process.exit(1);
}
console.log(`ok: ${ggufPath}: ${names.length} tensors (${values} values), ${tokens.length} tokens, ${merges.length} merges as llama.cpp's gpt2 expects`);
