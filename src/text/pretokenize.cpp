// The pre-tokenisation patterns of byte-level BPE tokenizers, matched by
// hand (include/nabla/tokenizer.h lists them). Each matcher returns the end
// of the pattern's match at position i < s.size(), trying the alternatives
// in the pattern's order as a backtracking regex engine would.
#include <cctype>

#include "nabla/error.h"
#include "nabla/tokenizer.h"
#include "text/unicode.h"

namespace nabla {

namespace {

using text::CodeClass;

CodeClass class_at(std::string_view s, size_t pos, size_t& len) {
  const uint32_t cp = text::decode_utf8(s, pos, len);
  return cp == text::kInvalid ? text::kOther : text::code_class(cp);
}

// The end of the run of code points of class `cls` that starts at `pos`.
size_t run_end(std::string_view s, size_t pos, CodeClass cls) {
  while (pos < s.size()) {
    size_t len;
    if (class_at(s, pos, len) != cls) break;
    pos += len;
  }
  return pos;
}

// "\s+(?!\S)|\s+" on the whitespace run at i: the run, less its last code
// point when a non-space follows (that one leads the next piece), unless the
// run is that one code point.
size_t whitespace_end(std::string_view s, size_t i) {
  size_t len;
  class_at(s, i, len);
  size_t last = i, end = i + len;
  while (end < s.size()) {
    size_t l;
    if (class_at(s, end, l) != text::kSpace) break;
    last = end;
    end += l;
  }
  if (end == s.size() || last == i) return end;
  return last;
}

// 's|'t|'re|'ve|'m|'ll|'d, ASCII case folded when `fold`.
size_t contraction_end(std::string_view s, size_t i, bool fold) {
  if (s[i] != '\'' || i + 1 >= s.size()) return i;
  auto at = [&](size_t k) { return fold ? char(std::tolower(static_cast<unsigned char>(s[k]))) : s[k]; };
  const char c = at(i + 1);
  if (c == 's' || c == 't' || c == 'm' || c == 'd') return i + 2;
  if (i + 2 < s.size()) {
    const char d = at(i + 2);
    if ((c == 'r' && d == 'e') || (c == 'v' && d == 'e') || (c == 'l' && d == 'l')) return i + 3;
  }
  return i;
}

//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
size_t gpt2_end(std::string_view s, size_t i) {
  if (size_t e = contraction_end(s, i, false); e > i) return e;
  size_t len;
  const CodeClass c0 = class_at(s, i, len);
  // " ?X+" for X = letters, numbers, other: a space may lead a run of X.
  if (s[i] == ' ' && i + 1 < s.size()) {
    size_t len1;
    const CodeClass c1 = class_at(s, i + 1, len1);
    if (c1 != text::kSpace) return run_end(s, i + 1, c1);
  }
  if (c0 != text::kSpace) return run_end(s, i, c0);
  return whitespace_end(s, i);
}

bool is_crlf(char c) { return c == '\r' || c == '\n'; }

// What follows the letter alternatives in Llama 3's, Qwen2's and o200k's
// patterns: \p{N}{1,max_digits}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|
// \s+(?!\S)|\s+ at i, where no letter alternative matched; o200k's
// ([\r\n/]* after the run, `slash`) takes slashes after those newlines too.
size_t tail_end(std::string_view s, size_t i, int max_digits, bool slash) {
  const size_t n = s.size();
  size_t len0;
  if (class_at(s, i, len0) == text::kNumber) {
    size_t end = i + len0;
    for (int count = 1; count < max_digits && end < n; ++count) {
      size_t l;
      if (class_at(s, end, l) != text::kNumber) break;
      end += l;
    }
    return end;
  }
  size_t start = i;
  if (s[i] == ' ' && i + 1 < n) {
    size_t l;
    if (class_at(s, i + 1, l) == text::kOther) start = i + 1;
  }
  size_t l;
  if (class_at(s, start, l) == text::kOther) {
    size_t end = run_end(s, start, text::kOther);
    while (end < n && (is_crlf(s[end]) || (slash && s[end] == '/'))) ++end;
    return end;
  }
  // Whitespace. "\s*[\r\n]+": up to the run's last \r or \n (a multi-byte
  // space never holds those bytes).
  const size_t run = run_end(s, i, text::kSpace);
  for (size_t k = run; k > i; --k) {
    if (is_crlf(s[k - 1])) return k;
  }
  return whitespace_end(s, i);
}

//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}|
//   ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
size_t llama3_end(std::string_view s, size_t i, int max_digits) {
  const size_t n = s.size();
  if (size_t e = contraction_end(s, i, true); e > i) return e;
  size_t len0;
  const CodeClass c0 = class_at(s, i, len0);
  if (c0 == text::kLetter) return run_end(s, i, text::kLetter);
  if (!is_crlf(s[i]) && c0 != text::kNumber && i + len0 < n) {
    size_t len1;
    if (class_at(s, i + len0, len1) == text::kLetter) return run_end(s, i + len0, text::kLetter);
  }
  return tail_end(s, i, max_digits, false);
}

// [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] (upper) or [\p{Ll}\p{Lm}\p{Lo}\p{M}] (lower)
// at pos; len its bytes.
bool cased_at(std::string_view s, size_t pos, size_t& len, bool upper) {
  const uint32_t cp = text::decode_utf8(s, pos, len);
  if (cp == text::kInvalid) return false;
  const text::LetterCase c = text::letter_case(cp);
  return c == text::kCaseless || c == (upper ? text::kUpper : text::kLower);
}

// The end of the run of (upper or lower) letters from pos; `last_lower` the
// start of the run's last code point that is also a lower one (npos: none).
size_t cased_run(std::string_view s, size_t pos, bool upper, size_t* last_lower = nullptr) {
  if (last_lower) *last_lower = std::string_view::npos;
  while (pos < s.size()) {
    size_t len;
    if (!cased_at(s, pos, len, upper)) break;
    if (last_lower && cased_at(s, pos, len, false)) *last_lower = pos;
    pos += len;
  }
  return pos;
}

//   [^\r\n\p{L}\p{N}]?[U]*[W]+C?|[^\r\n\p{L}\p{N}]?[U]+[W]*C?|\p{N}{1,3}|
//    ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
// U = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}], W = [\p{Ll}\p{Lm}\p{Lo}\p{M}],
// C = (?i:'s|'t|'re|'ve|'m|'ll|'d): GPT-4o's o200k (Phi-4-mini's).
size_t o200k_end(std::string_view s, size_t i) {
  const size_t n = s.size(), npos = std::string_view::npos;
  size_t len0;
  const CodeClass c0 = class_at(s, i, len0);
  // Each letter alternative first with the optional lead code point, then without.
  const bool can_lead = !is_crlf(s[i]) && c0 != text::kLetter && c0 != text::kNumber && i + len0 < n;
  const size_t starts[2] = {can_lead ? i + len0 : npos, i};
  for (size_t j : starts) {  // U* W+: the U run, given back to its last W if no W follows
    if (j == npos) continue;
    size_t last_lower;
    const size_t k = cased_run(s, j, true, &last_lower);
    size_t len;
    size_t end = npos;
    if (k < n && cased_at(s, k, len, false)) {
      end = cased_run(s, k, false);
    } else if (last_lower != npos) {
      cased_at(s, last_lower, len, false);
      end = last_lower + len;
    }
    if (end != npos) return std::max(end, contraction_end(s, end, true));
  }
  for (size_t j : starts) {  // U+ W*
    if (j == npos) continue;
    const size_t k = cased_run(s, j, true);
    if (k == j) continue;
    const size_t end = cased_run(s, k, false);
    return std::max(end, contraction_end(s, end, true));
  }
  return tail_end(s, i, 3, true);
}

}  // namespace

PreTokenizer parse_pre_tokenizer(const std::string& name) {
  if (name == "gpt2") return PreTokenizer::gpt2;
  if (name == "llama3") return PreTokenizer::llama3;
  if (name == "qwen2") return PreTokenizer::qwen2;
  if (name == "digits") return PreTokenizer::digits;
  if (name == "o200k") return PreTokenizer::o200k;
  throw UsageError("unknown pre-tokenizer '" + name + "' (gpt2, llama3, qwen2, digits, o200k)");
}

const char* pre_tokenizer_name(PreTokenizer p) {
  switch (p) {
    case PreTokenizer::gpt2:
      return "gpt2";
    case PreTokenizer::llama3:
      return "llama3";
    case PreTokenizer::qwen2:
      return "qwen2";
    case PreTokenizer::digits:
      return "digits";
    case PreTokenizer::o200k:
      return "o200k";
  }
  return "?";
}

std::vector<std::string_view> pre_tokenize(std::string_view text, PreTokenizer p) {
  std::vector<std::string_view> pieces;
  auto split = [&](std::string_view s) {
    for (size_t i = 0; i < s.size();) {
      const size_t end = p == PreTokenizer::llama3   ? llama3_end(s, i, 3)
                         : p == PreTokenizer::qwen2 ? llama3_end(s, i, 1)
                         : p == PreTokenizer::o200k ? o200k_end(s, i)
                                                    : gpt2_end(s, i);
      pieces.push_back(s.substr(i, end - i));
      i = end;
    }
  };
  if (p != PreTokenizer::digits) {
    split(text);
    return pieces;
  }
  // Digits(individual_digits): each \p{N} alone, gpt2's pattern in between.
  size_t from = 0;
  for (size_t i = 0; i < text.size();) {
    size_t len;
    if (class_at(text, i, len) == text::kNumber) {
      split(text.substr(from, i - from));
      pieces.push_back(text.substr(i, len));
      from = i + len;
    }
    i += len;
  }
  split(text.substr(from));
  return pieces;
}

}  // namespace nabla
