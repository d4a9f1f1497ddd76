// How join_launched_job() reaches MPI: nabla_mpi, where a program carries
// it, sets this when loaded, so that the core library itself needs no MPI.
#pragma once

#include <memory>

#include "nabla/distributed.h"

namespace nabla::dist {

using MpiJoin = std::unique_ptr<Communicator> (*)();
MpiJoin& mpi_join();

}  // namespace nabla::dist
