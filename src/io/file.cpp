// Atomic file replacement shared by every writer.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

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

void write_file_atomic(const std::string& path, const std::string& bytes) {
  remove_stale_temporaries(path);
  // The pid and a counter keep concurrent writers of one path (processes or
  // threads) from sharing a temporary.
  static std::atomic<uint64_t> counter{0};
  std::string tmp = path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError(path + ": cannot create " + tmp + ": " + std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw IoError(path + ": write failed: " + std::strerror(e));
    }
    done += static_cast<size_t>(n);
  }
  // The data must be on disk before the rename makes it the file.
  int synced = ::fsync(fd), sync_errno = errno;
  int closed = ::close(fd), close_errno = errno;
  if (synced != 0 || closed != 0) {
    int e = synced != 0 ? sync_errno : close_errno;
    ::unlink(tmp.c_str());
    throw IoError(path + ": flush failed: " + std::strerror(e));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    throw IoError(path + ": rename failed: " + std::strerror(e));
  }
  // Persist the rename itself: fsync the directory.
  // NOTE: one initialisation: assigning "/" afterwards made g++ 12 warn (a
  // false -Wrestrict in the inlined string copy).
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace nabla
