// Atomic file replacement shared by every writer.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "nabla/error.h"
#include "nabla/io.h"

namespace nabla {

namespace {

// Removes PATH.tmp-PID-N files whose writer PID no longer runs: a writer
// killed between creating its temporary and renaming it leaves one behind,
// and a training run that saves every few steps and is killed repeatedly
// would otherwise fill the disk with them. The file itself is never touched.
void remove_stale_temporaries(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  const std::string prefix = p.filename().string() + ".tmp-";
  std::error_code ec;
  fs::directory_iterator it(p.parent_path().empty() ? fs::path(".") : p.parent_path(), ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    char* rest = nullptr;
    const long pid = std::strtol(name.c_str() + prefix.size(), &rest, 10);
    if (pid <= 0 || *rest != '-') continue;
    if (::kill(static_cast<pid_t>(pid), 0) == -1 && errno == ESRCH) {
      std::error_code ignored;
      fs::remove(it->path(), ignored);
    }
  }
}

}  // namespace

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(path + ": cannot open for reading: " + std::strerror(errno));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw IoError(path + ": read failed");
  return bytes;
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  remove_stale_temporaries(path_);
  // The pid and a counter keep concurrent writers of one path (processes or
  // threads) from sharing a temporary.
  static std::atomic<uint64_t> counter{0};
  tmp_ = path_ + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw IoError(path_ + ": cannot create " + tmp_ + ": " + std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t bytes) {
  if (fd_ < 0) throw UsageError(path_ + ": write after commit");
  const char* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::write(fd_, p + done, bytes - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw IoError(path_ + ": write failed: " + std::strerror(n < 0 ? errno : ENOSPC));
    done += static_cast<size_t>(n);
  }
  written_ += bytes;
}

void AtomicFile::pad_to(uint64_t alignment) {
  static const char zeros[256] = {};
  uint64_t gap = (alignment - written_ % alignment) % alignment;
  while (gap > 0) {
    const size_t n = size_t(std::min<uint64_t>(gap, sizeof zeros));
    write(zeros, n);
    gap -= n;
  }
}

void AtomicFile::commit() {
  if (fd_ < 0) throw UsageError(path_ + ": committed twice");
  // The data must be on disk before the rename makes it the file.
  const int synced = ::fsync(fd_), sync_errno = errno;
  const int closed = ::close(fd_), close_errno = errno;
  fd_ = -1;
  if (synced != 0 || closed != 0) {
    ::unlink(tmp_.c_str());
    throw IoError(path_ + ": flush failed: " + std::strerror(synced != 0 ? sync_errno : close_errno));
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp_.c_str());
    throw IoError(path_ + ": rename failed: " + std::strerror(e));
  }
  // Persist the rename itself: fsync the directory.
  // NOTE: one initialisation: assigning "/" afterwards made g++ 12 warn (a
  // false -Wrestrict in the inlined string copy).
  const size_t slash = path_.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path_.substr(0, slash);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  AtomicFile file(path);
  file.write(bytes);
  file.commit();
}

}  // namespace nabla
