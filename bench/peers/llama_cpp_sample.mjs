// llama.cpp's side of bench/sample.sh: a prompt, then greedy tokens, on a
// GGUF model through node-llama-cpp's prebuilt CPU build at its defaults.
// Prints the rates as `nabla sample --timings` does: the prompt's tokens per
// second until the first new token is known, then the tokens after the first
// (one decoding step each) per second.
// Usage: node llama_cpp_sample.mjs NODE_LLAMA_CPP_DIR MODEL.gguf PROMPT_FILE TOKENS THREADS
import { readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";

const [pkg, modelPath, promptFile, tokensArg, threadsArg] = process.argv.slice(2);
const { getLlama } = await import(pathToFileURL(join(resolve(pkg), "dist/index.js")).href);
const want = Number(tokensArg);
const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
const model = await llama.loadModel({ modelPath });
const prompt = model.tokenize(readFileSync(promptFile, "utf8"), false);
const context = await model.createContext({ contextSize: prompt.length + want + 16, threads: Number(threadsArg), sequences: 1 });
const sequence = context.getSequence();
const t0 = performance.now();
let t1 = 0, n = 0;
for await (const token of sequence.evaluate(prompt, { temperature: 0 })) {
  if (++n === 1) t1 = performance.now();
  if (n >= want) break;
}
const t2 = performance.now();
const promptS = (t1 - t0) / 1e3, genS = (t2 - t1) / 1e3;
console.log(`prompt: ${prompt.length} tokens in ${promptS.toFixed(3)} s (${(prompt.length / promptS).toFixed(1)} tokens/s)`);
console.log(`generation: ${n} tokens, ${n - 1} decoding steps in ${genS.toFixed(3)} s (${((n - 1) / genS).toFixed(1)} tokens/s)`);
await context.dispose();
await model.dispose();
