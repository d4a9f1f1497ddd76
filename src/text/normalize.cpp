// Unicode normalization form C (UAX #15) over the generated tables
// (unicode_tables.cpp); Hangul syllables by their arithmetic.
#include <algorithm>
#include <vector>

#include "text/unicode.h"

namespace nabla::text {

namespace {

// Hangul: syllable = SBase + (L index * VCount + V index) * TCount + T index.
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

// A byte that is not UTF-8 travels as a code point no character has: it
// decomposes to itself, has class 0 and composes with nothing.
constexpr uint32_t kRawByte = 0x80000000u;

uint8_t combining_class(uint32_t cp) {
  if (cp < 0x300 || cp >= kRawByte) return 0;
  const CombiningRange* end = kCombiningRanges + kCombiningRangeCount;
  const CombiningRange* r =
      std::lower_bound(kCombiningRanges, end, cp, [](const CombiningRange& a, uint32_t v) { return a.last < v; });
  return r != end && r->first <= cp ? r->cls : 0;
}

void decompose(uint32_t cp, std::vector<uint32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + s % kNCount / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  if (cp >= 0xC0 && cp < kRawByte) {
    const Decomposition* end = kDecompositions + kDecompositionCount;
    const Decomposition* d =
        std::lower_bound(kDecompositions, end, cp, [](const Decomposition& a, uint32_t v) { return a.cp < v; });
    if (d != end && d->cp == cp) {
      decompose(d->first, out);
      if (d->second != 0) decompose(d->second, out);
      return;
    }
  }
  out.push_back(cp);
}

// The primary composite of (a, b), or 0.
uint32_t compose(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  const Composition* end = kCompositions + kCompositionCount;
  const Composition* c = std::lower_bound(kCompositions, end, std::pair{a, b}, [](const Composition& x, auto v) {
    return x.first != v.first ? x.first < v.first : x.second < v.second;
  });
  return c != end && c->first == a && c->second == b ? c->composite : 0;
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp >= kRawByte) {
    out += static_cast<char>(cp & 0xFF);
  } else if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace

std::string nfc(std::string_view text) {
  // ASCII neither decomposes nor composes.
  if (std::all_of(text.begin(), text.end(), [](char c) { return static_cast<uint8_t>(c) < 0x80; })) {
    return std::string(text);
  }
  std::vector<uint32_t> cps;
  cps.reserve(text.size());
  for (size_t pos = 0, len = 0; pos < text.size(); pos += len) {
    const uint32_t cp = decode_utf8(text, pos, len);
    decompose(cp == kInvalid ? kRawByte | static_cast<uint8_t>(text[pos]) : cp, cps);
  }
  // Canonical order: each run of non-starters sorted by class, stably.
  for (size_t i = 0; i < cps.size();) {
    if (combining_class(cps[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && combining_class(cps[j]) != 0) ++j;
    std::stable_sort(cps.begin() + std::ptrdiff_t(i), cps.begin() + std::ptrdiff_t(j),
                     [](uint32_t a, uint32_t b) { return combining_class(a) < combining_class(b); });
    i = j;
  }
  // Composition: each character joins the last starter unless a character
  // between them has class 0 or one at least its own.
  std::vector<uint32_t> out;
  out.reserve(cps.size());
  size_t starter = SIZE_MAX;
  uint8_t last = 0;  // the class of out's last character
  for (uint32_t cp : cps) {
    const uint8_t cls = combining_class(cp);
    if (starter != SIZE_MAX && (starter + 1 == out.size() || (last != 0 && last < cls))) {
      if (const uint32_t c = compose(out[starter], cp)) {
        out[starter] = c;
        continue;
      }
    }
    if (cls == 0) starter = out.size();
    last = cls;
    out.push_back(cp);
  }
  std::string s;
  s.reserve(text.size());
  for (uint32_t cp : out) append_utf8(cp, s);
  return s;
}

}  // namespace nabla::text
