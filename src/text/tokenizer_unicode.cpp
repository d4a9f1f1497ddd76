// Code point classes (a binary search in the generated range table) and
// UTF-8 decoding for the pre-tokeniser.
#include <algorithm>

#include "nabla/tokenizer.h"
#include "text/unicode.h"

namespace nabla::text {

namespace {

// The value of the range of a sorted, disjoint table that holds cp, or `none`.
template <class Range, class Value>
Value in_ranges(const Range* table, size_t count, uint32_t cp, Value none) {
  const Range* end = table + count;
  // The first range whose last code point is >= cp.
  const Range* r = std::lower_bound(table, end, cp, [](const Range& a, uint32_t v) { return a.last < v; });
  return r != end && r->first <= cp ? r->cls : none;
}

}  // namespace

CodeClass code_class(uint32_t cp) {
  if (cp < 0x80) {
    // The common case, without the search.
    if (cp == ' ' || (cp >= '\t' && cp <= '\r')) return kSpace;
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return kLetter;
    if (cp >= '0' && cp <= '9') return kNumber;
    return kOther;
  }
  return in_ranges(kCodePointRanges, kCodePointRangeCount, cp, kOther);
}

LetterCase letter_case(uint32_t cp) {
  if (cp < 0x80) {
    if (cp >= 'A' && cp <= 'Z') return kUpper;
    if (cp >= 'a' && cp <= 'z') return kLower;
    return kNoCase;
  }
  return in_ranges(kLetterCaseRanges, kLetterCaseRangeCount, cp, kNoCase);
}

uint32_t decode_utf8(std::string_view text, size_t pos, size_t& len) {
  auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  uint8_t b0 = byte(pos);
  len = 1;
  if (b0 < 0x80) return b0;
  size_t need;
  uint32_t cp, min;
  if ((b0 & 0xE0) == 0xC0) {
    need = 1, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    need = 2, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    need = 3, cp = b0 & 0x07, min = 0x10000;
  } else {
    return kInvalid;  // a continuation byte or 0xF8..0xFF
  }
  if (pos + need >= text.size()) return kInvalid;  // truncated
  for (size_t k = 1; k <= need; ++k) {
    uint8_t b = byte(pos + k);
    if ((b & 0xC0) != 0x80) return kInvalid;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return kInvalid;
  len = need + 1;
  return cp;
}

}  // namespace nabla::text

namespace nabla {

bool valid_utf8(std::string_view text) {
  for (size_t pos = 0, len = 0; pos < text.size(); pos += len) {
    if (text::decode_utf8(text, pos, len) == text::kInvalid) return false;
  }
  return true;
}

}  // namespace nabla
