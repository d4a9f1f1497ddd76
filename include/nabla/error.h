// User errors are exceptions of these types. Their messages name the op or
// file and say what was expected versus what was given, e.g.
//   matmul: inner dimensions differ: a is [4, 5], b is [6, 3]
#pragma once

#include <stdexcept>
#include <string>

namespace nabla {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A shape, axis or layout that does not fit the op.
class ShapeError : public Error {
 public:
  using Error::Error;
};

// An element type the op does not accept, or operands whose types differ.
class DTypeError : public Error {
 public:
  using Error::Error;
};

// A file that cannot be read or written, or whose contents are not what the
// format says.
class IoError : public Error {
 public:
  using Error::Error;
};

// An API used out of order or with an option it does not know.
class UsageError : public Error {
 public:
  using Error::Error;
};

// Processes of one distributed job that disagree (models, options, data) or
// a collective that cannot complete.
class DistributedError : public Error {
 public:
  using Error::Error;
};

}  // namespace nabla
