// Writes a SentencePiece-style BPE tokenizer.json as Hugging Face converts
// Llama 2's and Mistral's: pieces with U+2581 for spaces, <0xXX> byte
// fallback tokens, <unk> <s> </s>, and either the legacy normalizer (Prepend
// U+2581, Replace " ") or a Metaspace pre-tokenizer (prepend_scheme first);
// or Gemma's (GemmaConverter: Replace " " alone, a Split at spaces, a decoder
// that strips nothing).
// The vocabulary is learned here (a test fixture, not a tokenizer to use):
// the characters seen at least twice, then merges of the most frequent
// adjacent pair within space-started pieces (ties: the pair whose merged
// text sorts first) until VOCAB tokens. The merges are written as Hugging
// Face's converter writes a SentencePiece model's: every split of a token
// into two tokens, by the token's order (its score), then the halves' ids.
//
//   node make_spm_tokenizer.js TEXT OUT.json VOCAB legacy|metaspace|gemma
"use strict";
const fs = require("fs");

const [textFile, out, vocabArg, style] = process.argv.slice(2);
if (!out || !["legacy", "metaspace", "gemma"].includes(style)) {
  console.error("usage: make_spm_tokenizer.js TEXT OUT.json VOCAB legacy|metaspace|gemma");
  process.exit(2);
}
const target = Number(vocabArg);
const M = "\u2581";

// Words: each line's space-started pieces, counted.
const counts = new Map();
for (const line of fs.readFileSync(textFile, "utf8").split("\n")) {
  if (!line) continue;
  for (const w of (M + line.replaceAll(" ", M)).split(new RegExp(`(?=${M})`, "u"))) {
    if (w) counts.set(w, (counts.get(w) || 0) + 1);
  }
}
const charCount = new Map();
for (const [w, n] of counts) for (const c of w) charCount.set(c, (charCount.get(c) || 0) + n);

const specials = ["<unk>", "<s>", "</s>"];
const vocab = new Map(specials.map((t, i) => [t, i]));
for (let b = 0; b < 256; ++b) vocab.set(`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`, vocab.size);
for (const c of [...charCount.keys()].filter((c) => charCount.get(c) >= 2 || c === M).sort()) vocab.set(c, vocab.size);

// Each word as symbols; a character outside the vocabulary never merges.
const words = [...counts].map(([w, n]) => ({ s: [...w].map((c) => (vocab.has(c) ? c : null)), n }));
while (vocab.size < target) {
  const pairs = new Map();
  for (const { s, n } of words) {
    for (let i = 0; i + 1 < s.length; ++i) {
      if (s[i] === null || s[i + 1] === null) continue;
      const key = s[i] + " " + s[i + 1];
      pairs.set(key, (pairs.get(key) || 0) + n);
    }
  }
  let best = null, bestCount = 1;
  for (const [key, n] of pairs) {
    const merged = key.replace(" ", "");
    if (n > bestCount || (n === bestCount && best !== null && merged < best.replace(" ", ""))) {
      best = key;
      bestCount = n;
    }
  }
  if (best === null) break;
  const [a, b] = best.split(" ");
  const merged = a + b;
  // Another split of a text merged before makes no new token.
  if (!vocab.has(merged)) vocab.set(merged, vocab.size);
  for (const w of words) {
    const s = [];
    for (let i = 0; i < w.s.length; ++i) {
      if (i + 1 < w.s.length && w.s[i] === a && w.s[i + 1] === b) {
        s.push(merged);
        ++i;
      } else {
        s.push(w.s[i]);
      }
    }
    w.s = s;
  }
}

const converted = [];
for (const [token] of vocab) {
  const chars = [...token], splits = [];
  for (let i = 1; i < chars.length; ++i) {
    const left = chars.slice(0, i).join(""), right = chars.slice(i).join("");
    if (vocab.has(left) && vocab.has(right)) splits.push([left, right]);
  }
  splits.sort((x, y) => vocab.get(x[0]) - vocab.get(y[0]) || vocab.get(x[1]) - vocab.get(y[1]));
  for (const [left, right] of splits) converted.push(left + " " + right);
}

const added = specials.map((content, id) => ({
  id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true,
}));
const legacy = style === "legacy", gemma = style === "gemma";
const replace = { type: "Replace", pattern: { String: " " }, content: M };
const j = {
  version: "1.0",
  truncation: null,
  padding: null,
  added_tokens: added,
  normalizer: legacy ? { type: "Sequence", normalizers: [{ type: "Prepend", prepend: M }, replace] } : gemma ? replace : null,
  pre_tokenizer: legacy ? null
    : gemma ? { type: "Split", pattern: { String: " " }, behavior: "MergedWithPrevious", invert: false }
    : { type: "Metaspace", replacement: M, prepend_scheme: "first", split: false },
  post_processor: {
    type: "TemplateProcessing",
    single: [{ SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
    pair: [{ SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } },
      { SpecialToken: { id: "<s>", type_id: 1 } }, { Sequence: { id: "B", type_id: 1 } }],
    special_tokens: { "<s>": { id: "<s>", ids: [1], tokens: ["<s>"] } },
  },
  // The decoder Hugging Face's LlamaConverter writes in both its styles;
  // GemmaConverter's strips nothing.
  decoder: { type: "Sequence", decoders: [{ type: "Replace", pattern: { String: M }, content: " " }, { type: "ByteFallback" },
    { type: "Fuse" }, ...(gemma ? [] : [{ type: "Strip", content: " ", start: 1, stop: 0 }])] },
  model: {
    type: "BPE", dropout: null, unk_token: "<unk>", continuing_subword_prefix: null, end_of_word_suffix: null,
    fuse_unk: true, byte_fallback: true, ignore_merges: false, vocab: Object.fromEntries(vocab), merges: converted,
  },
};
fs.writeFileSync(out, JSON.stringify(j));
console.log(`${out}: ${vocab.size} tokens, ${converted.length} merges (${style})`);
