// Runs nabla's GGUF exports in llama.cpp (node-llama-cpp's prebuilt CPU
// build) and compares its next-token log-probabilities with nabla's.
// For each model and prompt in expected.json (write_fixtures.cpp), the token
// ids go into llama.cpp as they are (no tokenizer, no BOS) and llama.cpp's
// raw logits at every position are turned into log-probabilities here. At
// each position, nabla's 5 most likely tokens and llama.cpp's must agree:
// each of llama.cpp's top 5 is among nabla's top 10 and each of nabla's top 5
// has llama.cpp's log-probability, both within TOLERANCE. (So the two top-5
// lists are the same tokens in the same order, up to ties closer than that.)
// Usage: node check_llama_cpp.mjs DIR   (DIR holds expected.json and <model>.gguf)
import { readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { getLlama } from "node-llama-cpp";

// F32: both sides compute in f32 (an F32 key/value cache too): the
// differences are rounding, 1.1e-5 nats at most here. Block formats: llama.cpp
// multiplies them with activations rounded to 8 bits (Q8_0 / Q8_K), nabla
// with f32 activations and the same dequantized weights; on these random
// weights that moves log-probabilities by up to 0.18 nats (any of the four
// types), and a misread block (a scale or nibble out of place) by whole nats.
// An adapter (f32+lora: llama.cpp adds B (A x) scaled to each product) and a
// merged model are f32 computations too.
// GeGLU (gemma2, gemma3): llama.cpp's CPU GELU is approximate (GGML_GELU_FP16: its
// input rounded to f16, the value read from an f16 table), so its f32 files
// differ by up to 2.0e-4 nats; with that rounding emulated on nabla's side
// gemma3's agree to 7.5e-5 (measured 2026-12-07). Hence 3e-4 for the Gemmas' f32
// computations; a wrong window, scale, cap or norm moves them by 1e-2 or more.
const TOLERANCE = { f32: 1e-4, "f32+lora": 1e-4, merged: 1e-4, q8_0: 0.4, q4_0: 0.4, q4_k: 0.4, q6_k: 0.4 };
const GEGLU_F32_TOLERANCE = 3e-4;
const dir = resolve(process.argv[2]);
const expected = JSON.parse(readFileSync(join(dir, "expected.json"), "utf8"));
const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
let failures = 0, compared = 0;
const fail = (what) => {
  failures++;
  if (failures <= 20) console.log(`FAIL: ${what}`);
};

for (const [name, prompts] of Object.entries(expected)) {
  // "<model>.f32+lora": the F32 file with the adapter nabla converted.
  const [file, adapted] = name.split("+");
  const model = await llama.loadModel({ modelPath: join(dir, `${file}.gguf`) });
  const lora = adapted ? { adapters: [{ filePath: join(dir, `${name.split(".")[0]}.lora.adapter`) }] } : undefined;
  // An F32 key/value cache: llama.cpp keeps F16 by default, which alone moves
  // log-probabilities by a few 1e-3.
  const context = await model.createContext({
    contextSize: 64, threads: 2, sequences: 1, flashAttention: false,
    experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32", lora,
  });
  const sequence = context.getSequence();
  const kind = name.split(".")[1];
  const tolerance = name.startsWith("gemma") && TOLERANCE[kind] < 1e-3 ? GEGLU_F32_TOLERANCE : TOLERANCE[kind];
  let modelWorst = 0;
  for (const [p, prompt] of prompts.entries()) {
    await sequence.clearHistory();
    const out = await sequence.controlledEvaluate(prompt.tokens.map((t) => [t, { generateNext: { logits: true } }]));
    for (const [t, nablaTop] of prompt.top.entries()) {
      const logits = out[t]?.next?.logits;
      if (!logits) {
        fail(`${name} prompt ${p} position ${t}: llama.cpp gave no logits`);
        continue;
      }
      const values = [...logits.entries()];
      const max = Math.max(...values.map(([, v]) => v));
      const logSum = Math.log(values.reduce((s, [, v]) => s + Math.exp(v - max), 0));
      const lp = new Map(values.map(([tok, v]) => [tok, v - max - logSum]));
      const llamaTop = [...lp.entries()].sort((a, b) => b[1] - a[1]).slice(0, 5);
      const nablaLp = new Map(nablaTop);
      for (const [tok, v] of llamaTop) {
        const n = nablaLp.get(tok);
        if (n === undefined) fail(`${name} prompt ${p} position ${t}: llama.cpp's top token ${tok} (${v.toFixed(4)}) is not among nabla's top 10`);
        else modelWorst = Math.max(modelWorst, Math.abs(n - v));
      }
      for (const [tok, n] of nablaTop.slice(0, 5)) {
        const v = lp.get(tok);
        const d = v === undefined ? Infinity : Math.abs(n - v);
        modelWorst = Math.max(modelWorst, d);
        if (!(d <= tolerance)) fail(`${name} prompt ${p} position ${t}: token ${tok}: nabla ${n.toFixed(5)}, llama.cpp ${v?.toFixed(5)}`);
      }
      compared++;
    }
  }
  sequence.dispose();
  console.log(`${name}: ${prompts.length} prompts, top-5 log-probabilities within ${modelWorst.toExponential(2)} of nabla's (tolerance ${tolerance})`);
  await context.dispose();
  await model.dispose();
}
if (failures > 0) {
  console.log(`${failures} failure(s)`);
  process.exit(1);
}
console.log(`ok: ${compared} positions of ${Object.keys(expected).length} files, the same top-5 next tokens`);
