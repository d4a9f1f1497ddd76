// IDX reader (the MNIST format): magic 0x0000 TT RR with TT the element type
// and RR the rank, then RR big-endian u32 dimensions, then the data.
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "nabla/error.h"
#include "nabla/io.h"

namespace nabla {

namespace {

// How many leading bytes of an IDX file are worth keeping, judging from
// `prefix`: the header and the data its dimensions claim, or the first 16
// bytes of a file that cannot be IDX; SIZE_MAX while the header is incomplete.
size_t idx_bytes_to_keep(const std::vector<uint8_t>& prefix) {
  if (prefix.size() < 4) return SIZE_MAX;
  const int rank = prefix[3];
  if (prefix[0] != 0 || prefix[1] != 0 || prefix[2] != 0x08 || rank < 1 || rank > 4) return 16;
  const size_t header = 4 + 4 * size_t(rank);
  if (prefix.size() < header) return SIZE_MAX;
  uint64_t count = 1;
  for (int d = 0; d < rank; ++d) {
    const uint8_t* p = prefix.data() + 4 + 4 * d;
    uint64_t dim = (uint64_t(p[0]) << 24) | (uint64_t(p[1]) << 16) | (uint64_t(p[2]) << 8) | p[3];
    count = dim != 0 && count > (uint64_t(1) << 40) / dim ? (uint64_t(1) << 40) + 1 : count * dim;
  }
  return header + size_t(count);
}

// Reads the whole file through zlib, which passes uncompressed files through.
// Keeps only the bytes the IDX header claims (plus the header): a small
// corrupt or hostile .gz that inflates to gigabytes costs time, not memory.
// `total` is the file's full (decompressed) size.
std::vector<uint8_t> read_maybe_gzip(const std::string& path, uint64_t& total) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw IoError(path + ": cannot open for reading");
  std::vector<uint8_t> out;
  total = 0;
  uint8_t buf[1 << 16];
  for (;;) {
    int n = gzread(f, buf, sizeof buf);
    if (n < 0) {
      int err = 0;
      std::string msg = gzerror(f, &err);
      gzclose(f);
      if (msg.rfind(path + ": ", 0) == 0) msg.erase(0, path.size() + 2);  // zlib prefixes the path
      throw IoError(path + ": corrupt compressed data: " + msg);
    }
    if (n == 0) {
      // NOTE: zlib reports a gzip stream cut short as Z_BUF_ERROR but still
      // returns the bytes it had, so a truncated .gz must be caught here.
      int err = 0;
      gzerror(f, &err);
      if (err == Z_BUF_ERROR) {
        gzclose(f);
        throw IoError(path + ": truncated compressed data (unexpected end of the gzip stream)");
      }
      break;
    }
    total += uint64_t(n);
    const size_t keep = idx_bytes_to_keep(out);
    if (out.size() < keep) out.insert(out.end(), buf, buf + std::min<size_t>(size_t(n), keep - out.size()));
    if (total > (uint64_t(1) << 32)) {
      gzclose(f);
      throw IoError(path + ": larger than 4 GiB, not an IDX dataset");
    }
  }
  gzclose(f);
  return out;
}

}  // namespace

IdxArray read_idx(const std::string& path) {
  uint64_t total = 0;
  std::vector<uint8_t> bytes = read_maybe_gzip(path, total);
  if (total < 4) throw IoError(path + ": not an IDX file: " + std::to_string(total) + " bytes");
  if (bytes[0] != 0 || bytes[1] != 0) throw IoError(path + ": not an IDX file: bad magic number");
  if (bytes[2] != 0x08) {
    char type[8];
    std::snprintf(type, sizeof type, "0x%02x", bytes[2]);
    throw IoError(path + ": IDX element type " + type + " is not supported (only u8, 0x08)");
  }
  int rank = bytes[3];
  if (rank < 1 || rank > 4)
    throw IoError(path + ": IDX rank " + std::to_string(rank) + " is not 1 to 4");
  size_t header = 4 + 4 * size_t(rank);
  if (total < header) throw IoError(path + ": truncated IDX header");
  IdxArray a;
  uint64_t count = 1;
  for (int d = 0; d < rank; ++d) {
    const uint8_t* p = bytes.data() + 4 + 4 * d;
    uint64_t dim = (uint64_t(p[0]) << 24) | (uint64_t(p[1]) << 16) | (uint64_t(p[2]) << 8) | p[3];
    a.shape.push_back(static_cast<int64_t>(dim));
    // Dimensions are at most 2^32 - 1 each; saturate so four of them cannot wrap.
    count = dim != 0 && count > (uint64_t(1) << 40) / dim ? (uint64_t(1) << 40) + 1 : count * dim;
  }
  if (total - header != count) {
    throw IoError(path + ": IDX shape " + to_string(a.shape) + " needs " + std::to_string(count) +
                  " bytes of data, the file has " + std::to_string(total - header));
  }
  a.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header), bytes.end());
  return a;
}

}  // namespace nabla
