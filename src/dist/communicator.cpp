#include <cstdlib>
#include <cstring>

#include "nabla/distributed.h"
#include "nabla/error.h"
#include "dist/mpi_join.h"

namespace nabla::dist {

MpiJoin& mpi_join() {
  static MpiJoin join = nullptr;
  return join;
}

std::unique_ptr<Communicator> join_launched_job() {
  if (!launched()) return nullptr;
  if (MpiJoin join = mpi_join()) return join();
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (!size) size = std::getenv("PMI_SIZE");
  if (size && std::atoi(size) > 1) {
    throw UsageError("distributed: a launcher started " + std::string(size) +
                     " processes, and this program was built without MPI (nabla_mpi): install libopenmpi-dev and "
                     "build again (scripts/build)");
  }
  return nullptr;
}

bool launched() {
  // Open MPI's mpirun, and PMI/PMIx launchers (MPICH's hydra, Slurm's srun).
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"}) {
    if (std::getenv(v)) return true;
  }
  return false;
}

std::vector<int64_t> even_bounds(int64_t n, int parts) {
  if (parts < 1) throw UsageError("even_bounds: parts must be at least 1, got " + std::to_string(parts));
  std::vector<int64_t> bounds(static_cast<size_t>(parts) + 1);
  for (int r = 0; r <= parts; ++r) bounds[size_t(r)] = n * r / parts;
  return bounds;
}

uint64_t fingerprint(const void* data, size_t bytes, uint64_t hash) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 0x100000001b3ull;
  return hash;
}

void check_same(Communicator& comm, const std::string& what, const std::string& value) {
  // Fixed-size records: a 64-bit FNV-1a hash and the value's first bytes,
  // enough to say what differs without sending whole descriptions.
  constexpr size_t kShown = 200;
  struct Record {
    uint64_t hash;
    char text[kShown + 1];
  } mine{};
  mine.hash = fingerprint(value.data(), value.size());
  std::strncpy(mine.text, value.c_str(), kShown);
  std::vector<Record> all(size_t(comm.size()));
  comm.all_gather_bytes(&mine, all.data(), sizeof(Record));
  for (int r = 1; r < comm.size(); ++r) {
    if (all[size_t(r)].hash == all[0].hash) continue;
    throw DistributedError("distributed: the processes disagree on " + what + ": rank 0 has " + all[0].text +
                           ", rank " + std::to_string(r) + " has " + all[size_t(r)].text);
  }
}

}  // namespace nabla::dist
