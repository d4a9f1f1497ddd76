// llama.cpp tokenizes with the vocabulary nabla wrote into a GGUF file
// (tokenizer.ggml.*) exactly as nabla does: for each DIR/<name>.gguf, every
// line of DIR/lines.txt (and the whole of DIR/whole.txt) through
// node-llama-cpp's model.tokenize with special tokens on, against nabla's
// ids in DIR/<name>.lines and DIR/<name>.whole (`nabla tokenize --tokenizer
// <name>.gguf`, one line of ids per text).
// Usage: node check_tokenizers.mjs DIR NAME...
import { readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { getLlama } from "node-llama-cpp";

const dir = resolve(process.argv[2]);
const names = process.argv.slice(3);
const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
const lines = readFileSync(join(dir, "lines.txt"), "utf8").split("\n");
lines.pop();  // the file ends with a newline
const whole = readFileSync(join(dir, "whole.txt"), "utf8");
const ids = (text) => (text.trim() === "" ? [] : text.trim().split(" ").map(Number));
let failures = 0;
for (const name of names) {
  const model = await llama.loadModel({ modelPath: join(dir, `${name}.gguf`), vocabOnly: true });
  const nablaLines = readFileSync(join(dir, `${name}.lines`), "utf8").split("\n");
  let bad = 0, tokens = 0;
  for (const [i, line] of lines.entries()) {
    const got = [...model.tokenize(line, true)];
    const want = ids(nablaLines[i] ?? "");
    tokens += want.length;
    if (got.join(" ") !== want.join(" ")) {
      if (++bad <= 5) console.log(`FAIL ${name} line ${i + 1} ${JSON.stringify(line)}:\n  llama.cpp ${got.join(" ")}\n  nabla     ${want.join(" ")}`);
    }
  }
  const gotWhole = [...model.tokenize(whole, true)].join(" ");
  const wantWhole = ids(readFileSync(join(dir, `${name}.whole`), "utf8")).join(" ");
  if (gotWhole !== wantWhole) {
    bad++;
    console.log(`FAIL ${name}: the whole text tokenizes differently`);
  }
  console.log(`${name}: ${lines.length} lines (${tokens} tokens) and a text of ${whole.length} characters: ${bad === 0 ? "identical ids" : `${bad} differ`}`);
  failures += bad;
  await model.dispose();
}
if (failures > 0) process.exit(1);
