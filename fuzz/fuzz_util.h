// Shared by the libFuzzer targets in fuzz/: a per-process scratch directory
// for readers that take file paths, and the one contract every target checks.
//
// The contract: a reader given any bytes either succeeds or throws a
// nabla::Error (IoError, ShapeError, ...) whose message names the file. Any
// other exception (a JSON library's, std::bad_alloc, std::out_of_range), a
// crash, a sanitizer report, a leak or a huge allocation is a finding.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "nabla/error.h"

namespace nabla::fuzz {

// A directory of our own under $TMPDIR, removed at exit.
inline const std::string& scratch_dir() {
  struct Dir {
    std::string path =
        (std::filesystem::temp_directory_path() / ("nabla-fuzz-" + std::to_string(::getpid()))).string();
    Dir() { std::filesystem::create_directories(path); }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir dir;
  return dir.path;
}

// Writes `bytes` to scratch_dir()/name and returns the path.
inline std::string write_input(const std::string& name, std::string_view bytes) {
  std::string path = scratch_dir() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    std::fprintf(stderr, "fuzz harness: cannot write %s\n", path.c_str());
    std::abort();
  }
  return path;
}

// Runs `read`; a nabla::Error must name `file` (when given), anything else
// that escapes is reported as a finding by aborting.
template <class F>
void expect_clean(const std::string& file, F&& read) {
  try {
    read();
  } catch (const nabla::Error& e) {
    if (!file.empty() && std::string_view(e.what()).find(file) == std::string_view::npos) {
      std::fprintf(stderr, "error message does not name the file %s: %s\n", file.c_str(), e.what());
      std::abort();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "escaped a non-nabla exception: %s\n", e.what());
    std::abort();
  }
}

}  // namespace nabla::fuzz
