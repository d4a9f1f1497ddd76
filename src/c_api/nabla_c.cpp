// The C API (include/nabla.h): thin wrappers over the C++ API.
//
// Every entry point runs its body inside guard(), which turns each exception
// into a status code and a thread-local message, so no error crosses the C
// boundary. Argument problems the C++ API cannot see (NULL pointers, negative
// counts, handles of another context) are ArgumentErrors raised here.
#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "nabla.h"
#include "nabla/distributed.h"
#include "nabla/error.h"
#include "nabla/executor.h"
#include "nabla/finetune_data.h"
#include "nabla/graph.h"
#include "nabla/io.h"
#include "nabla/models/finetune.h"
#include "nabla/models/generate.h"
#include "nabla/models/gguf.h"
#include "nabla/ops.h"
#include "nabla/tensor.h"
#include "nabla/tokenizer.h"
#include "nabla/trainer.h"
#include "ops/internal_ops.h"

struct nabla_tensor {
  nabla::Tensor t;
  nabla_context* ctx;
};

namespace {

// The process's job (nabla_job_join): one per process, as MPI's world is,
// held by every handle, trainer and session on it; the process leaves it
// (MPI_Finalize) when the last of them goes.
struct Job {
  std::unique_ptr<nabla::dist::Communicator> comm;  // null: a process no launcher started
  int rank() const { return comm ? comm->rank() : 0; }
  int size() const { return comm ? comm->size() : 1; }
  // What a step over the job folds through: none for a job of one.
  nabla::dist::Communicator* step_comm() const { return size() > 1 ? comm.get() : nullptr; }
  std::string description;
};

}  // namespace

struct nabla_job {
  std::shared_ptr<Job> job;
};

struct nabla_trainer {
  std::shared_ptr<Job> job;  // NABLA_TRAIN_JOB's; outlives the step
  std::unique_ptr<nabla::TrainStep> step;
  nabla_context* ctx;
  bool ran = false;  // a run finished: the loss and extras hold its values
  std::vector<nabla_tensor*> parameter_handles;  // made on first request
  // Handles nabla_trainer_replica made: which replica's executor holds each.
  std::unordered_map<const nabla::Node*, std::pair<int, nabla_tensor*>> replica_handles;
};

struct nabla_finetune {
  std::shared_ptr<Job> job;  // NABLA_FINETUNE_JOB's; outlives the session
  std::unique_ptr<nabla::models::FinetuneSession> session;
  std::vector<nabla::models::FinetuneSession::Inputs> replicas;
  std::unique_ptr<nabla::Tokenizer> tokenizer;  // the base's
  std::string base;
  std::optional<std::string> chat_template;  // the base's Jinja, read on first use
  int64_t steps = 0;                            // for the adapters' dropout seeds
  uint64_t seed = 1;
};

struct nabla_context {
  // Handles live as long as the context: FFI code may hold them anywhere.
  std::vector<std::unique_ptr<nabla_tensor>> tensors;

  // The last nabla_backward: a graph whose outputs are the loss and gradients.
  std::optional<nabla::Graph> backward;
  uint64_t backward_generation = 0;
  std::unordered_map<const nabla::Node*, nabla_tensor*> grad_handles;

  // The last nabla_compute, reused while outputs, threads and backward match.
  std::unique_ptr<nabla::Executor> executor;
  std::vector<const nabla::Node*> executor_outputs;
  int executor_threads = 0;
  std::string backend = "cpu";  // nabla_context_set_backend
  uint64_t executor_generation = 0;
  bool executor_ran = false;  // false after a run that threw: values are partial

  // Trainers live as long as the context too, unless freed earlier.
  std::vector<std::unique_ptr<nabla_trainer>> trainers;

  nabla_tensor* wrap(nabla::Tensor t) {
    tensors.push_back(std::make_unique<nabla_tensor>(nabla_tensor{std::move(t), this}));
    return tensors.back().get();
  }
};

namespace {

thread_local std::string last_error;

class ArgumentError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

nabla_status fail(nabla_status status, const char* message) {
  last_error = message;
  return status;
}

template <class F>
nabla_status guard(F&& body) {
  try {
    body();
    return NABLA_OK;
  } catch (const ArgumentError& e) {
    return fail(NABLA_ERROR_ARGUMENT, e.what());
  } catch (const nabla::ShapeError& e) {
    return fail(NABLA_ERROR_SHAPE, e.what());
  } catch (const nabla::DTypeError& e) {
    return fail(NABLA_ERROR_DTYPE, e.what());
  } catch (const nabla::IoError& e) {
    return fail(NABLA_ERROR_IO, e.what());
  } catch (const nabla::UsageError& e) {
    return fail(NABLA_ERROR_USAGE, e.what());
  } catch (const nabla::Error& e) {
    return fail(NABLA_ERROR_RUNTIME, e.what());
  } catch (const std::bad_alloc&) {
    return fail(NABLA_ERROR_INTERNAL, "out of memory");
  } catch (const std::exception& e) {
    return fail(NABLA_ERROR_INTERNAL, e.what());
  } catch (...) {
    return fail(NABLA_ERROR_INTERNAL, "unknown exception");
  }
}

// f's exception, or null.
template <class F>
std::exception_ptr attempt(F&& f) {
  try {
    f();
    return nullptr;
  } catch (...) {
    return std::current_exception();
  }
}

// Argument checks for one entry point, whose name every message carries.
struct Call {
  const char* fn;

  [[noreturn]] void argument_error(const std::string& what) const {
    throw ArgumentError(std::string(fn) + ": " + what);
  }
  template <class P>
  P* need(P* p, const char* arg) const {
    if (!p) argument_error(std::string("argument '") + arg + "' is NULL");
    return p;
  }
  nabla_context& context(nabla_context* ctx) const { return *need(ctx, "ctx"); }
  const nabla::Tensor& tensor(nabla_context* ctx, nabla_tensor* t, const std::string& arg) const {
    if (!t) argument_error("argument '" + arg + "' is NULL");
    if (t->ctx != ctx) argument_error("tensor '" + arg + "' belongs to another context");
    return t->t;
  }
  nabla::Shape ints(const int64_t* p, int n, const char* arg, const char* count) const {
    if (n < 0) {
      argument_error(std::string("argument '") + count + "' is negative (" + std::to_string(n) +
                     ")");
    }
    if (n > 0 && !p) {
      argument_error(std::string("argument '") + arg + "' is NULL but '" + count + "' is " +
                     std::to_string(n));
    }
    return n > 0 ? nabla::Shape(p, p + n) : nabla::Shape{};
  }
  // An optional tensor argument: NULL is "none".
  nabla::Tensor optional(nabla_context* ctx, nabla_tensor* t, const std::string& arg) const {
    return t ? tensor(ctx, t, arg) : nabla::Tensor();
  }
  // Two values (height, width), or `fallback` when p is NULL.
  nabla::Size2d pair(const int64_t* p, nabla::Size2d fallback) const {
    return p ? nabla::Size2d(p[0], p[1]) : fallback;
  }
  nabla::DType dtype(nabla_dtype d) const {
    switch (d) {
      case NABLA_F32:
        return nabla::DType::f32;
      case NABLA_F64:
        return nabla::DType::f64;
      case NABLA_I32:
        return nabla::DType::i32;
    }
    throw nabla::DTypeError(std::string(fn) + ": unknown dtype " +
                            std::to_string(static_cast<int>(d)) +
                            "; expected NABLA_F32 (0), NABLA_F64 (1) or NABLA_I32 (2)");
  }
};

// The body of every op entry point: check ctx and out, build, hand back.
template <class Build>
nabla_status op_call(const char* fn, nabla_context* ctx, nabla_tensor** out, Build&& build) {
  return guard([&] {
    Call c{fn};
    nabla_context& context = c.context(ctx);
    c.need(out, "out");
    nabla::Tensor result = build(c);
    *out = context.wrap(std::move(result));
  });
}

nabla_status make_leaf(const char* fn, nabla_context* ctx, nabla_dtype dtype, int rank,
                       const int64_t* shape, const void* data, bool parameter, nabla_tensor** out) {
  return op_call(fn, ctx, out, [&](Call& c) {
    nabla::Tensor t =
        nabla::Tensor::from_data(c.dtype(dtype), c.ints(shape, rank, "shape", "rank"), data);
    if (parameter) t.requires_grad();
    return t;
  });
}

}  // namespace

// Op lists: adding an op with one of these signatures is one line here and
// one declaration in nabla.h.
#define NABLA_C_UNARY_OPS(X) \
  X(neg)                     \
  X(exp)                     \
  X(log)                     \
  X(sqrt)                    \
  X(rsqrt)                   \
  X(square)                  \
  X(abs)                     \
  X(tanh)                    \
  X(sigmoid)                 \
  X(relu)                    \
  X(silu)                    \
  X(step)                    \
  X(sign)                    \
  X(contiguous)              \
  X(gelu)                    \
  X(gelu_erf)                \
  X(gelu_quick)              \
  X(erf)                     \
  X(hardswish)               \
  X(log_softmax)

#define NABLA_C_BINARY_OPS(X) \
  X(add, a, b)                \
  X(sub, a, b)                \
  X(mul, a, b)                \
  X(div, a, b)                \
  X(eq, a, b)                 \
  X(matmul, a, b)             \
  X(get_rows, table, indices) \
  X(cross_entropy_soft, logits, probs)

#define NABLA_C_REDUCE_OPS(X) \
  X(sum)                      \
  X(mean)                     \
  X(max)

namespace {

// The session's chat options for `chat_template` (NULL: "auto", the base's own).
nabla::FinetuneDataOptions chat_options(nabla_finetune* ft, const char* chat_template) {
  if (!ft->chat_template) ft->chat_template = nabla::models::checkpoint_chat_template(ft->base);
  return nabla::chat_template_options(chat_template ? chat_template : "auto", *ft->chat_template, ft->base);
}

// f(), its IoError or UsageError (a bad line, template name, token id) reported
// as the arguments' fault, not a file's.
template <typename F>
auto as_argument_error(const Call& c, F f) -> decltype(f()) {
  try {
    return f();
  } catch (const nabla::IoError& e) {
    c.argument_error(e.what());
  } catch (const nabla::UsageError& e) {
    c.argument_error(e.what());
  }
}

}  // namespace

extern "C" {

const char* nabla_last_error(void) { return last_error.c_str(); }

const char* nabla_status_string(nabla_status status) {
  switch (status) {
    case NABLA_OK:
      return "NABLA_OK";
    case NABLA_ERROR_SHAPE:
      return "NABLA_ERROR_SHAPE";
    case NABLA_ERROR_DTYPE:
      return "NABLA_ERROR_DTYPE";
    case NABLA_ERROR_IO:
      return "NABLA_ERROR_IO";
    case NABLA_ERROR_USAGE:
      return "NABLA_ERROR_USAGE";
    case NABLA_ERROR_INTERNAL:
      return "NABLA_ERROR_INTERNAL";
    case NABLA_ERROR_ARGUMENT:
      return "NABLA_ERROR_ARGUMENT";
    case NABLA_ERROR_RUNTIME:
      return "NABLA_ERROR_RUNTIME";
  }
  return "NABLA_UNKNOWN_STATUS";
}

// ---- Context

nabla_status nabla_context_create(nabla_context** out) {
  return guard([&] {
    Call{"nabla_context_create"}.need(out, "out");
    *out = new nabla_context();
  });
}

void nabla_context_free(nabla_context* ctx) { delete ctx; }

nabla_status nabla_context_set_backend(nabla_context* ctx, const char* backend) {
  return guard([&] {
    Call c{"nabla_context_set_backend"};
    nabla_context& context = c.context(ctx);
    c.need(backend, "backend");
    const std::vector<std::string> names = nabla::backend_names();
    if (std::find(names.begin(), names.end(), std::string(backend)) == names.end()) {
      std::string known;
      for (const std::string& n : names) known += (known.empty() ? "" : ", ") + n;
      throw nabla::UsageError(std::string("nabla_context_set_backend: no backend named '") + backend +
                              "'; this build has " + known);
    }
    // "cuda" on a machine without a GPU: why not, now rather than at the first compute.
    if (const std::string why = nabla::backend_unavailable(backend); !why.empty()) {
      throw nabla::UsageError("nabla_context_set_backend: " + why);
    }
    if (context.backend != backend) context.executor.reset();
    context.backend = backend;
  });
}

// ---- Leaves

nabla_status nabla_tensor_from_data(nabla_context* ctx, nabla_dtype dtype, int rank,
                                    const int64_t* shape, const void* data, nabla_tensor** out) {
  return make_leaf("nabla_tensor_from_data", ctx, dtype, rank, shape, data, false, out);
}

nabla_status nabla_parameter(nabla_context* ctx, nabla_dtype dtype, int rank, const int64_t* shape,
                             const void* data, nabla_tensor** out) {
  return make_leaf("nabla_parameter", ctx, dtype, rank, shape, data, true, out);
}

nabla_status nabla_tensor_write(nabla_context* ctx, nabla_tensor* t, const void* src,
                                size_t bytes) {
  return guard([&] {
    Call c{"nabla_tensor_write"};
    c.context(ctx);
    nabla::Tensor leaf = c.tensor(ctx, t, "t");
    if (bytes > 0) c.need(src, "src");
    leaf.copy_from(src, bytes);
  });
}

// ---- Shape queries

nabla_status nabla_tensor_rank(nabla_tensor* t, int* out) {
  return guard([&] {
    Call c{"nabla_tensor_rank"};
    *c.need(out, "out") = c.need(t, "t")->t.rank();
  });
}

nabla_status nabla_tensor_shape(nabla_tensor* t, int64_t* dims, int capacity) {
  return guard([&] {
    Call c{"nabla_tensor_shape"};
    const nabla::Shape& shape = c.need(t, "t")->t.shape();
    if (capacity < static_cast<int>(shape.size())) {
      c.argument_error("capacity " + std::to_string(capacity) + " is less than the rank " +
                       std::to_string(shape.size()) + " of " + nabla::to_string(t->t));
    }
    if (!shape.empty())
      std::memcpy(c.need(dims, "dims"), shape.data(), shape.size() * sizeof(int64_t));
  });
}

nabla_status nabla_tensor_dtype(nabla_tensor* t, nabla_dtype* out) {
  return guard([&] {
    Call c{"nabla_tensor_dtype"};
    *c.need(out, "out") = static_cast<nabla_dtype>(c.need(t, "t")->t.dtype());
  });
}

nabla_status nabla_tensor_numel(nabla_tensor* t, int64_t* out) {
  return guard([&] {
    Call c{"nabla_tensor_numel"};
    *c.need(out, "out") = c.need(t, "t")->t.numel();
  });
}

// ---- Ops

#define NABLA_C_DEFINE_UNARY(name)                                                     \
  nabla_status nabla_##name(nabla_context* ctx, nabla_tensor* x, nabla_tensor** out) { \
    return op_call("nabla_" #name, ctx, out,                                           \
                   [&](Call& c) { return nabla::name(c.tensor(ctx, x, "x")); });       \
  }
NABLA_C_UNARY_OPS(NABLA_C_DEFINE_UNARY)
#undef NABLA_C_DEFINE_UNARY

#define NABLA_C_DEFINE_BINARY(name, a, b)                                         \
  nabla_status nabla_##name(nabla_context* ctx, nabla_tensor* a, nabla_tensor* b, \
                            nabla_tensor** out) {                                 \
    return op_call("nabla_" #name, ctx, out, [&](Call& c) {                       \
      return nabla::name(c.tensor(ctx, a, #a), c.tensor(ctx, b, #b));             \
    });                                                                           \
  }
NABLA_C_BINARY_OPS(NABLA_C_DEFINE_BINARY)
#undef NABLA_C_DEFINE_BINARY

#define NABLA_C_DEFINE_REDUCE(name)                                                              \
  nabla_status nabla_##name(nabla_context* ctx, nabla_tensor* x, const int64_t* axes, int naxes, \
                            int keepdim, nabla_tensor** out) {                                   \
    return op_call("nabla_" #name, ctx, out, [&](Call& c) {                                      \
      return nabla::name(c.tensor(ctx, x, "x"), c.ints(axes, naxes, "axes", "naxes"),            \
                         keepdim != 0);                                                          \
    });                                                                                          \
  }
NABLA_C_REDUCE_OPS(NABLA_C_DEFINE_REDUCE)
#undef NABLA_C_DEFINE_REDUCE

nabla_status nabla_where(nabla_context* ctx, nabla_tensor* cond, nabla_tensor* a, nabla_tensor* b,
                         nabla_tensor** out) {
  return op_call("nabla_where", ctx, out, [&](Call& c) {
    return nabla::where(c.tensor(ctx, cond, "cond"), c.tensor(ctx, a, "a"), c.tensor(ctx, b, "b"));
  });
}

nabla_status nabla_matmul_add(nabla_context* ctx, nabla_tensor* a, nabla_tensor* b, nabla_tensor* c,
                              nabla_tensor** out) {
  return op_call("nabla_matmul_add", ctx, out, [&](Call& call) {
    return nabla::matmul_add(call.tensor(ctx, a, "a"), call.tensor(ctx, b, "b"), call.tensor(ctx, c, "c"));
  });
}

nabla_status nabla_scale(nabla_context* ctx, nabla_tensor* x, double factor, nabla_tensor** out) {
  return op_call("nabla_scale", ctx, out,
                 [&](Call& c) { return nabla::scale(c.tensor(ctx, x, "x"), factor); });
}

nabla_status nabla_reshape(nabla_context* ctx, nabla_tensor* x, int rank, const int64_t* shape,
                           nabla_tensor** out) {
  return op_call("nabla_reshape", ctx, out, [&](Call& c) {
    return nabla::reshape(c.tensor(ctx, x, "x"), c.ints(shape, rank, "shape", "rank"));
  });
}

nabla_status nabla_permute(nabla_context* ctx, nabla_tensor* x, int rank, const int64_t* order,
                           nabla_tensor** out) {
  return op_call("nabla_permute", ctx, out, [&](Call& c) {
    return nabla::permute(c.tensor(ctx, x, "x"), c.ints(order, rank, "order", "rank"));
  });
}

nabla_status nabla_transpose(nabla_context* ctx, nabla_tensor* x, int64_t axis0, int64_t axis1,
                             nabla_tensor** out) {
  return op_call("nabla_transpose", ctx, out,
                 [&](Call& c) { return nabla::transpose(c.tensor(ctx, x, "x"), axis0, axis1); });
}

nabla_status nabla_slice(nabla_context* ctx, nabla_tensor* x, int64_t axis, int64_t start,
                         int64_t stop, int64_t step, nabla_tensor** out) {
  return op_call("nabla_slice", ctx, out, [&](Call& c) {
    return nabla::slice(c.tensor(ctx, x, "x"), axis, start, stop, step);
  });
}

nabla_status nabla_expand(nabla_context* ctx, nabla_tensor* x, int rank, const int64_t* shape,
                          nabla_tensor** out) {
  return op_call("nabla_expand", ctx, out, [&](Call& c) {
    return nabla::expand(c.tensor(ctx, x, "x"), c.ints(shape, rank, "shape", "rank"));
  });
}

nabla_status nabla_concat(nabla_context* ctx, nabla_tensor* const* xs, size_t n, int64_t axis,
                          nabla_tensor** out) {
  return op_call("nabla_concat", ctx, out, [&](Call& c) {
    if (n > 0) c.need(xs, "xs");
    std::vector<nabla::Tensor> inputs;
    for (size_t i = 0; i < n; ++i)
      inputs.push_back(c.tensor(ctx, xs[i], "xs[" + std::to_string(i) + "]"));
    return nabla::concat(inputs, axis);
  });
}

nabla_status nabla_scatter_slice(nabla_context* ctx, nabla_tensor* x, int rank, const int64_t* full,
                                 int64_t axis, int64_t start, int64_t stop, int64_t step,
                                 nabla_tensor** out) {
  return op_call("nabla_scatter_slice", ctx, out, [&](Call& c) {
    return nabla::scatter_slice(c.tensor(ctx, x, "x"), c.ints(full, rank, "full", "rank"), axis,
                                start, stop, step);
  });
}

nabla_status nabla_scatter_add_rows(nabla_context* ctx, nabla_tensor* values, nabla_tensor* indices,
                                    int64_t rows, nabla_tensor** out) {
  return op_call("nabla_scatter_add_rows", ctx, out, [&](Call& c) {
    return nabla::scatter_add_rows(c.tensor(ctx, values, "values"),
                                   c.tensor(ctx, indices, "indices"), rows);
  });
}

nabla_status nabla_softplus(nabla_context* ctx, nabla_tensor* x, double beta, double threshold,
                            nabla_tensor** out) {
  return op_call("nabla_softplus", ctx, out,
                 [&](Call& c) { return nabla::softplus(c.tensor(ctx, x, "x"), beta, threshold); });
}

nabla_status nabla_elu(nabla_context* ctx, nabla_tensor* x, double alpha, nabla_tensor** out) {
  return op_call("nabla_elu", ctx, out, [&](Call& c) { return nabla::elu(c.tensor(ctx, x, "x"), alpha); });
}

nabla_status nabla_leaky_relu(nabla_context* ctx, nabla_tensor* x, double slope, nabla_tensor** out) {
  return op_call("nabla_leaky_relu", ctx, out,
                 [&](Call& c) { return nabla::leaky_relu(c.tensor(ctx, x, "x"), slope); });
}

nabla_status nabla_clamp(nabla_context* ctx, nabla_tensor* x, double lo, double hi, nabla_tensor** out) {
  return op_call("nabla_clamp", ctx, out,
                 [&](Call& c) { return nabla::clamp(c.tensor(ctx, x, "x"), lo, hi); });
}

nabla_status nabla_layer_norm(nabla_context* ctx, nabla_tensor* x, nabla_tensor* gamma, nabla_tensor* beta,
                              double eps, nabla_tensor** out) {
  return op_call("nabla_layer_norm", ctx, out, [&](Call& c) {
    return nabla::layer_norm(c.tensor(ctx, x, "x"), c.optional(ctx, gamma, "gamma"),
                             c.optional(ctx, beta, "beta"), eps);
  });
}

nabla_status nabla_rms_norm(nabla_context* ctx, nabla_tensor* x, nabla_tensor* gamma, double eps,
                            nabla_tensor** out) {
  return op_call("nabla_rms_norm", ctx, out, [&](Call& c) {
    return nabla::rms_norm(c.tensor(ctx, x, "x"), c.optional(ctx, gamma, "gamma"), eps);
  });
}

nabla_status nabla_softmax(nabla_context* ctx, nabla_tensor* x, double scale, nabla_tensor* mask, int causal,
                           nabla_tensor** out) {
  return op_call("nabla_softmax", ctx, out, [&](Call& c) {
    return nabla::softmax(c.tensor(ctx, x, "x"), scale, c.optional(ctx, mask, "mask"), causal != 0);
  });
}

nabla_status nabla_cross_entropy(nabla_context* ctx, nabla_tensor* logits, nabla_tensor* labels,
                                 int64_t ignore_index, nabla_tensor** out) {
  return op_call("nabla_cross_entropy", ctx, out, [&](Call& c) {
    return nabla::cross_entropy(c.tensor(ctx, logits, "logits"), c.tensor(ctx, labels, "labels"),
                                ignore_index);
  });
}

namespace {
// The C API's "scale <= 0": the op's default, 1/sqrt(D).
std::optional<double> attention_scale(double scale) {
  return scale > 0 ? std::optional<double>(scale) : std::nullopt;
}
}  // namespace

nabla_status nabla_scaled_dot_product_attention(nabla_context* ctx, nabla_tensor* q, nabla_tensor* k,
                                                nabla_tensor* v, nabla_tensor* mask, int causal,
                                                double scale, nabla_tensor** out) {
  return op_call("nabla_scaled_dot_product_attention", ctx, out, [&](Call& c) {
    return nabla::scaled_dot_product_attention(c.tensor(ctx, q, "q"), c.tensor(ctx, k, "k"),
                                               c.tensor(ctx, v, "v"), c.optional(ctx, mask, "mask"),
                                               causal != 0, attention_scale(scale));
  });
}

nabla_status nabla_attention(nabla_context* ctx, nabla_tensor* q, nabla_tensor* k, nabla_tensor* v,
                             int causal, double scale, nabla_tensor** out) {
  return op_call("nabla_attention", ctx, out, [&](Call& c) {
    return nabla::attention(c.tensor(ctx, q, "q"), c.tensor(ctx, k, "k"), c.tensor(ctx, v, "v"),
                            causal != 0, attention_scale(scale));
  });
}

nabla_status nabla_attention_within(nabla_context* ctx, nabla_tensor* q, nabla_tensor* k, nabla_tensor* v,
                                    int causal, double scale, nabla_tensor* segments, int64_t window,
                                    nabla_tensor** out) {
  return op_call("nabla_attention_within", ctx, out, [&](Call& c) {
    return nabla::attention(c.tensor(ctx, q, "q"), c.tensor(ctx, k, "k"), c.tensor(ctx, v, "v"), causal != 0,
                            attention_scale(scale), c.optional(ctx, segments, "segments"), window);
  });
}

nabla_status nabla_attention_capped(nabla_context* ctx, nabla_tensor* q, nabla_tensor* k, nabla_tensor* v,
                                    int causal, double scale, nabla_tensor* segments, int64_t window,
                                    double softcap, nabla_tensor** out) {
  return op_call("nabla_attention_capped", ctx, out, [&](Call& c) {
    return nabla::attention(c.tensor(ctx, q, "q"), c.tensor(ctx, k, "k"), c.tensor(ctx, v, "v"), causal != 0,
                            attention_scale(scale), c.optional(ctx, segments, "segments"), window, softcap);
  });
}

static nabla::RopeMode rope_mode(const Call& c, int mode) {
  if (mode != 0 && mode != 1) {
    c.argument_error("unknown mode " + std::to_string(mode) + "; expected 0 (GPT-NeoX) or 1 (original)");
  }
  return static_cast<nabla::RopeMode>(mode);
}

nabla_status nabla_rope(nabla_context* ctx, nabla_tensor* x, int64_t offset, double base, int mode,
                        nabla_tensor** out) {
  return op_call("nabla_rope", ctx, out, [&](Call& c) {
    return nabla::rope(c.tensor(ctx, x, "x"), offset, base, rope_mode(c, mode));
  });
}

nabla_status nabla_rope_at(nabla_context* ctx, nabla_tensor* x, nabla_tensor* positions, int64_t offset,
                           double base, int mode, const double* freq_factors, int64_t n_factors, int64_t dims,
                           double scale, nabla_tensor** out) {
  return op_call("nabla_rope_at", ctx, out, [&](Call& c) {
    if (n_factors < 0) c.argument_error("argument 'n_factors' is negative (" + std::to_string(n_factors) + ")");
    if (n_factors > 0 && !freq_factors) {
      c.argument_error("argument 'freq_factors' is NULL but 'n_factors' is " + std::to_string(n_factors));
    }
    if (positions && offset != 0) {
      c.argument_error("both positions and offset " + std::to_string(offset) + " given; offset applies only "
                       "without positions");
    }
    const std::vector<double> factors(freq_factors, freq_factors + n_factors);
    const nabla::Tensor& in = c.tensor(ctx, x, "x");
    const nabla::RopeMode m = rope_mode(c, mode);
    return positions ? nabla::rope(in, c.tensor(ctx, positions, "positions"), base, m, factors, dims, scale)
                     : nabla::rope(in, offset, base, m, factors, dims, scale);
  });
}

nabla_status nabla_dropout(nabla_context* ctx, nabla_tensor* x, double p, nabla_tensor* seed, int train,
                           int64_t salt, nabla_tensor** out) {
  return op_call("nabla_dropout", ctx, out, [&](Call& c) {
    return nabla::dropout(c.tensor(ctx, x, "x"), p, c.tensor(ctx, seed, "seed"), train != 0, salt);
  });
}

nabla_status nabla_conv_2d(nabla_context* ctx, nabla_tensor* x, nabla_tensor* w, nabla_tensor* bias,
                           const int64_t* stride, const int64_t* padding, const int64_t* dilation,
                           int64_t groups, nabla_tensor** out) {
  return op_call("nabla_conv_2d", ctx, out, [&](Call& c) {
    return nabla::conv_2d(c.tensor(ctx, x, "x"), c.tensor(ctx, w, "w"), c.optional(ctx, bias, "bias"),
                          c.pair(stride, 1), c.pair(padding, 0), c.pair(dilation, 1), groups);
  });
}

nabla_status nabla_conv_transpose_2d(nabla_context* ctx, nabla_tensor* x, nabla_tensor* w, nabla_tensor* bias,
                                     const int64_t* stride, const int64_t* padding,
                                     const int64_t* output_padding, const int64_t* dilation, int64_t groups,
                                     nabla_tensor** out) {
  return op_call("nabla_conv_transpose_2d", ctx, out, [&](Call& c) {
    return nabla::conv_transpose_2d(c.tensor(ctx, x, "x"), c.tensor(ctx, w, "w"),
                                    c.optional(ctx, bias, "bias"), c.pair(stride, 1), c.pair(padding, 0),
                                    c.pair(output_padding, 0), c.pair(dilation, 1), groups);
  });
}

nabla_status nabla_avg_pool_2d(nabla_context* ctx, nabla_tensor* x, const int64_t* kernel,
                               const int64_t* stride, const int64_t* padding, nabla_tensor** out) {
  return op_call("nabla_avg_pool_2d", ctx, out, [&](Call& c) {
    nabla::Size2d k = c.pair(c.need(kernel, "kernel"), 1);
    return nabla::avg_pool_2d(c.tensor(ctx, x, "x"), k, c.pair(stride, k), c.pair(padding, 0));
  });
}

nabla_status nabla_max_pool_2d(nabla_context* ctx, nabla_tensor* x, const int64_t* kernel,
                               const int64_t* stride, const int64_t* padding, nabla_tensor** out) {
  return op_call("nabla_max_pool_2d", ctx, out, [&](Call& c) {
    nabla::Size2d k = c.pair(c.need(kernel, "kernel"), 1);
    return nabla::max_pool_2d(c.tensor(ctx, x, "x"), k, c.pair(stride, k), c.pair(padding, 0));
  });
}

nabla_status nabla_pad(nabla_context* ctx, nabla_tensor* x, int rank, const int64_t* pads, double value,
                       nabla_tensor** out) {
  return op_call("nabla_pad", ctx, out, [&](Call& c) {
    if (rank > INT32_MAX / 2) c.argument_error("rank " + std::to_string(rank) + " is too large");
    nabla::Shape flat = c.ints(pads, rank > 0 ? 2 * rank : rank, "pads", "rank");
    std::vector<std::pair<int64_t, int64_t>> pairs;
    for (size_t i = 0; i + 1 < flat.size(); i += 2) pairs.emplace_back(flat[i], flat[i + 1]);
    return nabla::pad(c.tensor(ctx, x, "x"), pairs, value);
  });
}

nabla_status nabla_repeat(nabla_context* ctx, nabla_tensor* x, int rank, const int64_t* repeats,
                          nabla_tensor** out) {
  return op_call("nabla_repeat", ctx, out, [&](Call& c) {
    return nabla::repeat(c.tensor(ctx, x, "x"), c.ints(repeats, rank, "repeats", "rank"));
  });
}

nabla_status nabla_set_rows(nabla_context* ctx, nabla_tensor* dst, nabla_tensor* indices, nabla_tensor* values,
                            nabla_tensor** out) {
  return op_call("nabla_set_rows", ctx, out, [&](Call& c) {
    return nabla::set_rows(c.tensor(ctx, dst, "dst"), c.tensor(ctx, indices, "indices"),
                           c.tensor(ctx, values, "values"));
  });
}

nabla_status nabla_argmax(nabla_context* ctx, nabla_tensor* x, int64_t axis, int keepdim, nabla_tensor** out) {
  return op_call("nabla_argmax", ctx, out,
                 [&](Call& c) { return nabla::argmax(c.tensor(ctx, x, "x"), axis, keepdim != 0); });
}

nabla_status nabla_one_hot(nabla_context* ctx, nabla_tensor* indices, int64_t classes, nabla_dtype dtype,
                           nabla_tensor** out) {
  return op_call("nabla_one_hot", ctx, out, [&](Call& c) {
    return nabla::one_hot(c.tensor(ctx, indices, "indices"), classes, c.dtype(dtype));
  });
}

// ---- Autodiff and running

nabla_status nabla_backward(nabla_context* ctx, nabla_tensor* loss) {
  return guard([&] {
    Call c{"nabla_backward"};
    nabla_context& context = c.context(ctx);
    nabla::Graph graph;
    graph.backward(c.tensor(ctx, loss, "loss"));
    // Replace the old state only once the new gradients are built.
    context.backward = std::move(graph);
    ++context.backward_generation;
    context.grad_handles.clear();
  });
}

nabla_status nabla_grad(nabla_context* ctx, nabla_tensor* t, nabla_tensor** out) {
  return guard([&] {
    Call c{"nabla_grad"};
    nabla_context& context = c.context(ctx);
    const nabla::Tensor& param = c.tensor(ctx, t, "t");
    c.need(out, "out");
    if (!context.backward)
      throw nabla::UsageError("nabla_grad: no gradients yet; call nabla_backward first");
    if (!context.backward->has_grad(param)) {
      throw nabla::UsageError("nabla_grad: no gradient of " + nabla::to_string(param) +
                              (param.is_parameter()
                                   ? ": it does not reach the loss of the last nabla_backward"
                                   : ": it is not a parameter; create it with nabla_parameter"));
    }
    // One handle per gradient, however often a training loop asks for it.
    auto [slot, inserted] = context.grad_handles.try_emplace(param.node(), nullptr);
    if (inserted) slot->second = context.wrap(context.backward->grad(param));
    *out = slot->second;
  });
}

nabla_status nabla_compute_arena_bytes(nabla_context* ctx, int64_t* out) {
  return guard([&] {
    Call c{"nabla_compute_arena_bytes"};
    nabla_context& context = c.context(ctx);
    c.need(out, "out");
    if (!context.executor) throw nabla::UsageError("nabla_compute_arena_bytes: nothing computed yet");
    *out = int64_t(context.executor->memory().arena_bytes);
  });
}

nabla_status nabla_recompute_begin(nabla_context* ctx, uint64_t* mark) {
  return guard([&] {
    Call c{"nabla_recompute_begin"};
    c.context(ctx);
    *c.need(mark, "mark") = nabla::recompute_mark();
  });
}

nabla_status nabla_recompute_end(nabla_context* ctx, uint64_t mark, nabla_tensor* output) {
  return guard([&] {
    Call c{"nabla_recompute_end"};
    nabla::recompute_region(mark, c.tensor(ctx, output, "output"));
  });
}

nabla_status nabla_compute(nabla_context* ctx, nabla_tensor* const* outputs, size_t n,
                           int threads) {
  return guard([&] {
    Call c{"nabla_compute"};
    nabla_context& context = c.context(ctx);
    if (n > 0) c.need(outputs, "outputs");
    std::vector<nabla::Tensor> wanted;
    std::vector<const nabla::Node*> key;
    for (size_t i = 0; i < n; ++i) {
      wanted.push_back(c.tensor(ctx, outputs[i], "outputs[" + std::to_string(i) + "]"));
      key.push_back(wanted.back().node());
    }
    if (wanted.empty() && !context.backward) {
      throw nabla::UsageError(
          "nabla_compute: nothing to compute: no outputs were given and no nabla_backward was "
          "recorded");
    }

    bool reuse = context.executor && context.executor_outputs == key &&
                 context.executor_threads == threads &&
                 context.executor_generation == context.backward_generation;
    if (!reuse) {
      context.executor.reset();
      nabla::Graph graph;
      for (const nabla::Tensor& t : wanted) graph.add_output(t);
      if (context.backward) {
        for (const nabla::Tensor& t : context.backward->outputs()) graph.add_output(t);
      }
      context.executor = std::make_unique<nabla::Executor>(
          graph, nabla::ExecOptions{.threads = threads, .backend = context.backend});
      context.executor_outputs = std::move(key);
      context.executor_threads = threads;
      context.executor_generation = context.backward_generation;
    }
    context.executor_ran = false;
    context.executor->run();
    context.executor_ran = true;
  });
}

namespace {

// A leaf's value is its host memory, computed or not.
void read_leaf(const char* fn, const nabla::Tensor& value, void* dst, size_t bytes) {
  size_t need = static_cast<size_t>(value.numel()) * nabla::dtype_size(value.dtype());
  if (bytes != need) {
    throw nabla::ShapeError(std::string(fn) + ": read of " + nabla::to_string(value) + " needs " +
                            std::to_string(need) + " bytes, got a buffer of " + std::to_string(bytes));
  }
  if (need > 0) value.copy_to(dst, need);
}

}  // namespace

nabla_status nabla_tensor_read(nabla_context* ctx, nabla_tensor* t, void* dst, size_t bytes) {
  return guard([&] {
    Call c{"nabla_tensor_read"};
    nabla_context& context = c.context(ctx);
    const nabla::Tensor& value = c.tensor(ctx, t, "t");
    if (bytes > 0) c.need(dst, "dst");
    if (value.is_leaf()) return read_leaf("nabla_tensor_read", value, dst, bytes);
    if (!context.executor) {
      throw nabla::UsageError(
          "nabla_tensor_read: nothing has been computed; call nabla_compute first");
    }
    if (!context.executor_ran) {
      throw nabla::UsageError(
          "nabla_tensor_read: the last nabla_compute failed, so its values are incomplete");
    }
    context.executor->read(value, dst, bytes);
  });
}

// ---- Checkpoints

namespace {

// names[i] with tensors[i], checked: non-NULL, of this context.
std::vector<std::pair<std::string, nabla::Tensor>> named_tensors(const Call& c, nabla_context* ctx,
                                                                 const char* const* names,
                                                                 nabla_tensor* const* tensors, size_t n) {
  if (n > 0) {
    c.need(names, "names");
    c.need(tensors, "tensors");
  }
  std::vector<std::pair<std::string, nabla::Tensor>> out;
  for (size_t i = 0; i < n; ++i) {
    const std::string index = std::to_string(i);
    const std::string name_arg = "names[" + index + "]";
    out.emplace_back(c.need(names[i], name_arg.c_str()), c.tensor(ctx, tensors[i], "tensors[" + index + "]"));
  }
  return out;
}

// The tensor `name` of a loaded file, which must have `like`'s shape and dtype.
const nabla::Tensor& stored_like(const nabla::Safetensors& loaded, const std::string& file, const std::string& name,
                                 const nabla::Tensor& like) {
  const nabla::Tensor* t = loaded.find(name);
  if (!t) throw nabla::IoError(file + ": no tensor named '" + name + "'");
  if (t->shape() != like.shape() || t->dtype() != like.dtype()) {
    throw nabla::ShapeError(file + ": tensor '" + name + "' is " + nabla::to_string(*t) +
                            ", the leaf to load it into is " + nabla::to_string(like));
  }
  return *t;
}

// Copies sources[i] into leaves[i]; called once every source is known to fit,
// so that a file that does not fit changes nothing.
void write_leaves(const std::vector<nabla::Tensor>& leaves, const std::vector<const nabla::Tensor*>& sources) {
  for (size_t i = 0; i < leaves.size(); ++i) {
    nabla::Tensor leaf = leaves[i];
    leaf.copy_from(sources[i]->data(), static_cast<size_t>(leaf.numel()) * nabla::dtype_size(leaf.dtype()));
  }
}

}  // namespace

nabla_status nabla_save_safetensors(nabla_context* ctx, const char* path, const char* const* names,
                                    nabla_tensor* const* tensors, size_t n) {
  return guard([&] {
    Call c{"nabla_save_safetensors"};
    c.context(ctx);
    nabla::save_safetensors(c.need(path, "path"), named_tensors(c, ctx, names, tensors, n));
  });
}

nabla_status nabla_load_safetensors(nabla_context* ctx, const char* path, const char* const* names,
                                    nabla_tensor* const* tensors, size_t n) {
  return guard([&] {
    Call c{"nabla_load_safetensors"};
    c.context(ctx);
    const std::string file = c.need(path, "path");
    auto wanted = named_tensors(c, ctx, names, tensors, n);
    nabla::Safetensors loaded = nabla::load_safetensors(file);
    std::vector<nabla::Tensor> leaves;
    std::vector<const nabla::Tensor*> sources;
    for (const auto& [name, leaf] : wanted) {
      if (!leaf.is_leaf()) {
        throw nabla::UsageError("nabla_load_safetensors: '" + name + "' is to be loaded into " +
                                nabla::to_string(leaf) + ", which is not a leaf");
      }
      leaves.push_back(leaf);
      sources.push_back(&stored_like(loaded, file, name, leaf));
    }
    write_leaves(leaves, sources);
  });
}

// ---- Jobs

namespace {

std::mutex job_mutex;
std::weak_ptr<Job> process_job;  // the job handles, trainers and sessions hold

// The job a NABLA_*_JOB flag names: the one this process joined.
std::shared_ptr<Job> joined_job(const char* fn, const char* flag) {
  std::lock_guard lock(job_mutex);
  std::shared_ptr<Job> job = process_job.lock();
  if (!job) throw nabla::UsageError(std::string(fn) + ": " + flag + ", but this process has not joined a job (nabla_job_join)");
  return job;
}

bool writes_for_job(const Job* job) { return !job || job->rank() == 0; }

// Work rank 0 does for the whole job (writing a file), whose outcome every
// process returns: rank 0 its own error, the others one naming rank 0.
// `error` is rank 0's (null elsewhere, and on success).
void share_outcome(const Job* job, std::exception_ptr error, const std::string& what) {
  nabla::dist::Communicator* comm = job ? job->step_comm() : nullptr;
  if (comm) {
    int32_t failed = error ? 1 : 0;
    comm->broadcast(&failed, sizeof failed, 0);
    if (failed && !error) throw nabla::IoError(what + ": failed on rank 0, which writes for the job (its error says why)");
  }
  if (error) std::rethrow_exception(error);
}

// Before a job-wide change: every process's own checks passed (`error`:
// this one's failure) and, for a load, they read the same values (`hash`);
// else every process throws, and none changes anything. `failed` says what
// went wrong on another process.
void agree_before_changing(const Job* job, std::exception_ptr error, uint64_t hash, const std::string& what,
                           const std::string& failed) {
  nabla::dist::Communicator* comm = job ? job->step_comm() : nullptr;
  if (!comm) {
    if (error) std::rethrow_exception(error);
    return;
  }
  const uint64_t mine[2] = {error ? 1u : 0u, hash};
  std::vector<uint64_t> all(2 * size_t(comm->size()));
  comm->all_gather_bytes(mine, all.data(), sizeof mine);
  if (error) std::rethrow_exception(error);
  for (int r = 0; r < comm->size(); ++r) {
    if (all[2 * size_t(r)]) throw nabla::DistributedError(what + ": rank " + std::to_string(r) + " " + failed);
  }
  for (int r = 1; r < comm->size(); ++r) {
    if (all[2 * size_t(r) + 1] != all[1]) {
      throw nabla::DistributedError(what + ": rank " + std::to_string(r) + " read other values than rank 0; nothing was changed");
    }
  }
}

}  // namespace

nabla_status nabla_job_join(nabla_job** out) {
  return guard([&] {
    const Call c{"nabla_job_join"};
    c.need(out, "out");
    std::lock_guard lock(job_mutex);
    std::shared_ptr<Job> job = process_job.lock();
    if (!job) {
      job = std::make_shared<Job>();
      job->comm = nabla::dist::join_launched_job();
      job->description = job->comm ? job->comm->describe() : "1 process (no launcher)";
      process_job = job;
    }
    *out = new nabla_job{std::move(job)};
  });
}

nabla_status nabla_job_rank(nabla_job* job, int* rank, int* size) {
  return guard([&] {
    const Job& j = *Call{"nabla_job_rank"}.need(job, "job")->job;
    if (rank) *rank = j.rank();
    if (size) *size = j.size();
  });
}

nabla_status nabla_job_describe(nabla_job* job, const char** out) {
  return guard([&] {
    const Call c{"nabla_job_describe"};
    *c.need(out, "out") = c.need(job, "job")->job->description.c_str();
  });
}

nabla_status nabla_job_sum(nabla_job* job, double* values, size_t n) {
  return guard([&] {
    const Call c{"nabla_job_sum"};
    const Job& j = *c.need(job, "job")->job;
    if (n > 0) c.need(values, "values");
    nabla::dist::Communicator* comm = j.step_comm();
    if (!comm || n == 0) return;
    std::vector<double> all(n * size_t(comm->size()));
    comm->all_gather_bytes(values, all.data(), n * sizeof(double));
    for (size_t i = 0; i < n; ++i) {
      double sum = all[i];
      for (size_t r = 1; r < size_t(comm->size()); ++r) sum += all[r * n + i];
      values[i] = sum;
    }
  });
}

nabla_status nabla_job_broadcast(nabla_job* job, void* data, size_t bytes, int root) {
  return guard([&] {
    const Call c{"nabla_job_broadcast"};
    const Job& j = *c.need(job, "job")->job;
    if (bytes > 0) c.need(data, "data");
    if (root < 0 || root >= j.size()) {
      c.argument_error("root " + std::to_string(root) + " is outside [0, " + std::to_string(j.size()) + ")");
    }
    if (nabla::dist::Communicator* comm = j.step_comm()) comm->broadcast(data, bytes, root);
  });
}

nabla_status nabla_job_barrier(nabla_job* job) {
  return guard([&] {
    const Job& j = *Call{"nabla_job_barrier"}.need(job, "job")->job;
    if (nabla::dist::Communicator* comm = j.step_comm()) comm->barrier();
  });
}

void nabla_job_free(nabla_job* job) { delete job; }

// ---- Training step

nabla_status nabla_trainer_create(nabla_context* ctx, nabla_tensor* loss, nabla_tensor* const* extras,
                                  size_t n_extras, double beta1, double beta2, double eps,
                                  double weight_decay, nabla_tensor* const* no_decay, size_t n_no_decay,
                                  int threads, int flags, nabla_trainer** out) {
  return guard([&] {
    Call c{"nabla_trainer_create"};
    nabla_context& context = c.context(ctx);
    c.need(out, "out");
    const nabla::Tensor& objective = c.tensor(ctx, loss, "loss");
    constexpr int kKnownFlags = NABLA_TRAIN_BF16_MATMUL | NABLA_TRAIN_LOW_MEMORY | NABLA_TRAIN_JOB |
                                NABLA_TRAIN_SHARD_OPTIMIZER | NABLA_TRAIN_REPLICAS(255);
    if (flags & ~kKnownFlags) {
      c.argument_error("unknown flags " + std::to_string(flags & ~kKnownFlags) +
                       "; expected NABLA_TRAIN_BF16_MATMUL (1), NABLA_TRAIN_LOW_MEMORY (2), NABLA_TRAIN_JOB (4), "
                       "NABLA_TRAIN_SHARD_OPTIMIZER (8) and NABLA_TRAIN_REPLICAS(1 to 255)");
    }
    if ((flags & NABLA_TRAIN_SHARD_OPTIMIZER) && !(flags & NABLA_TRAIN_JOB)) {
      c.argument_error("NABLA_TRAIN_SHARD_OPTIMIZER shards the moments over a job's processes: add NABLA_TRAIN_JOB");
    }
    const int replicas = std::max(1, (flags >> 8) & 255);
    if (n_extras > 0) c.need(extras, "extras");
    std::vector<nabla::Tensor> outputs;
    for (size_t i = 0; i < n_extras; ++i)
      outputs.push_back(c.tensor(ctx, extras[i], "extras[" + std::to_string(i) + "]"));

    // The C API's parameters have no names: they are numbered in the order
    // the loss first reaches them.
    nabla::nn::Params params;
    std::vector<nabla::Tensor> reached = nabla::find_parameters({objective});
    if (reached.empty()) {
      throw nabla::UsageError("nabla_trainer_create: no parameter reaches the loss; create weights with "
                              "nabla_parameter");
    }
    for (size_t i = 0; i < reached.size(); ++i) params.add("parameter " + std::to_string(i), reached[i]);
    if (n_no_decay > 0) c.need(no_decay, "no_decay");
    std::vector<size_t> undecayed;
    for (size_t i = 0; i < n_no_decay; ++i) {
      const nabla::Tensor& t = c.tensor(ctx, no_decay[i], "no_decay[" + std::to_string(i) + "]");
      size_t slot = 0;
      while (slot < reached.size() && reached[slot].node() != t.node()) ++slot;
      if (slot == reached.size()) {
        c.argument_error("no_decay[" + std::to_string(i) + "] (" + nabla::to_string(t) +
                         ") is not a parameter that reaches the loss");
      }
      undecayed.push_back(slot);
    }

    nabla::ExecOptions options{
        .threads = threads, .bf16_matmul = (flags & NABLA_TRAIN_BF16_MATMUL) != 0, .backend = context.backend};
    auto trainer = std::make_unique<nabla_trainer>();
    trainer->ctx = ctx;
    if (flags & NABLA_TRAIN_JOB) trainer->job = joined_job(c.fn, "NABLA_TRAIN_JOB");
    trainer->step = std::make_unique<nabla::TrainStep>(
        objective, params, outputs, nabla::optim::AdamWConfig{beta1, beta2, eps, weight_decay}, options,
        nabla::StepOptions{.low_memory = (flags & NABLA_TRAIN_LOW_MEMORY) != 0,
                           .replicas = replicas,
                           .comm = trainer->job ? trainer->job->step_comm() : nullptr,
                           .shard_optimizer = (flags & NABLA_TRAIN_SHARD_OPTIMIZER) != 0});
    for (size_t slot : undecayed) trainer->step->optimizer().set_decay(slot, false);
    context.trainers.push_back(std::move(trainer));
    *out = context.trainers.back().get();
  });
}

nabla_status nabla_trainer_run(nabla_trainer* trainer, float* loss) {
  return guard([&] {
    nabla::TrainStep& step = *Call{"nabla_trainer_run"}.need(trainer, "trainer")->step;
    trainer->ran = false;
    step.run();
    trainer->ran = true;
    if (loss) *loss = step.loss();
  });
}

nabla_status nabla_trainer_update(nabla_trainer* trainer, double lr, double clip, double* grad_norm) {
  return guard([&] {
    Call c{"nabla_trainer_update"};
    nabla::TrainStep& step = *c.need(trainer, "trainer")->step;
    if (!(clip >= 0)) c.argument_error("clip " + std::to_string(clip) + " is negative or NaN");
    double norm = step.update(lr, clip);
    if (grad_norm) *grad_norm = norm;
  });
}

nabla_status nabla_trainer_read(nabla_trainer* trainer, nabla_tensor* t, void* dst, size_t bytes) {
  return guard([&] {
    Call c{"nabla_trainer_read"};
    c.need(trainer, "trainer");
    const nabla::Tensor& value = c.tensor(trainer->ctx, t, "t");
    if (bytes > 0) c.need(dst, "dst");
    if (value.is_leaf()) return read_leaf("nabla_trainer_read", value, dst, bytes);
    if (!trainer->ran) {
      throw nabla::UsageError("nabla_trainer_read: no values to read: the trainer has not run, or its last "
                              "nabla_trainer_run failed");
    }
    const auto copy = trainer->replica_handles.find(value.node());
    trainer->step->executor(copy == trainer->replica_handles.end() ? 0 : copy->second.first)
        .read(value, dst, bytes);
  });
}

nabla_status nabla_trainer_replica(nabla_trainer* trainer, int replica, nabla_tensor* t, nabla_tensor** out) {
  return guard([&] {
    Call c{"nabla_trainer_replica"};
    const nabla::TrainStep& step = *c.need(trainer, "trainer")->step;
    const nabla::Tensor& original = c.tensor(trainer->ctx, t, "t");
    c.need(out, "out");
    if (replica < 0 || replica >= step.replicas()) {
      c.argument_error("replica " + std::to_string(replica) + " is outside [0, " + std::to_string(step.replicas()) +
                       ")");
    }
    nabla::Tensor copy;
    try {
      copy = step.in_replica(replica, original);
    } catch (const nabla::UsageError&) {
      c.argument_error("t (" + nabla::to_string(original) + ") is not a tensor of the trainer's graph");
    }
    if (copy.node() == original.node()) {
      *out = t;
      return;
    }
    auto& handle = trainer->replica_handles[copy.node()];
    if (!handle.second) handle = {replica, trainer->ctx->wrap(copy)};
    *out = handle.second;
  });
}

nabla_status nabla_trainer_parameters(nabla_trainer* trainer, int64_t* count, int64_t* elements,
                                      int64_t* factored) {
  return guard([&] {
    Call c{"nabla_trainer_parameters"};
    const nabla::TrainStep& step = *c.need(trainer, "trainer")->step;
    const auto& slots = step.optimizer().slots();
    int64_t total = 0;
    for (const auto& slot : slots) total += slot.param.numel();
    if (count) *count = static_cast<int64_t>(slots.size());
    if (elements) *elements = total;
    if (factored) *factored = step.factored_gradients();
  });
}

nabla_status nabla_trainer_parameter(nabla_trainer* trainer, int64_t index, nabla_tensor** out) {
  return guard([&] {
    Call c{"nabla_trainer_parameter"};
    const auto& slots = c.need(trainer, "trainer")->step->optimizer().slots();
    c.need(out, "out");
    if (index < 0 || index >= static_cast<int64_t>(slots.size())) {
      c.argument_error("index " + std::to_string(index) + " is outside [0, " + std::to_string(slots.size()) +
                       ")");
    }
    auto& handles = trainer->parameter_handles;
    if (handles.empty()) {
      for (const auto& slot : slots) handles.push_back(trainer->ctx->wrap(slot.param));
    }
    *out = handles[static_cast<size_t>(index)];
  });
}

namespace {

constexpr const char* kOptimizerSteps = "nabla.optimizer_steps";
// AdamW::state()'s names for a slot's moments, in its order.
constexpr const char* kMoments[2] = {"optimizer.exp_avg.", "optimizer.exp_avg_sq."};

// The checkpoint name of each of the trainer's parameters.
std::vector<std::string> checkpoint_names(const Call& c, const nabla_trainer* trainer, const char* const* names) {
  const size_t n = trainer->step->optimizer().slots().size();
  std::vector<std::string> out;
  for (size_t i = 0; i < n; ++i) {
    const std::string index = std::to_string(i);
    const std::string arg = "names[" + index + "]";
    out.push_back(names ? std::string(c.need(names[i], arg.c_str())) : "parameter." + index);
  }
  return out;
}

}  // namespace

nabla_status nabla_trainer_save(nabla_trainer* trainer, const char* path, const char* const* names) {
  return guard([&] {
    Call c{"nabla_trainer_save"};
    c.need(trainer, "trainer");
    const std::string file = c.need(path, "path");
    const std::vector<std::string> saved = checkpoint_names(c, trainer, names);
    const Job* job = trainer->job.get();
    std::exception_ptr error;
    // Every process takes part (a sharded step gathers the moments to rank 0); rank 0 writes.
    trainer->step->with_optimizer_state([&](const nabla::optim::AdamW& adamw) {
      if (!writes_for_job(job)) return;
      error = attempt([&] {
        const auto moments = adamw.state();  // per slot: exp_avg, then exp_avg_sq
        std::vector<std::pair<std::string, nabla::Tensor>> tensors;
        for (size_t i = 0; i < saved.size(); ++i) tensors.emplace_back(saved[i], adamw.slots()[i].param);
        for (size_t i = 0; i < saved.size(); ++i) {
          for (size_t m = 0; m < 2; ++m) tensors.emplace_back(kMoments[m] + saved[i], moments[2 * i + m].second);
        }
        nabla::save_safetensors(file, tensors, {{kOptimizerSteps, std::to_string(adamw.steps())}});
      });
    });
    share_outcome(job, error, "nabla_trainer_save: " + file);
  });
}

nabla_status nabla_trainer_load(nabla_trainer* trainer, const char* path, const char* const* names) {
  return guard([&] {
    Call c{"nabla_trainer_load"};
    c.need(trainer, "trainer");
    const std::string file = c.need(path, "path");
    const std::vector<std::string> wanted = checkpoint_names(c, trainer, names);
    nabla::TrainStep& step = *trainer->step;
    const auto& slots = step.optimizer().slots();

    // Every tensor found and fitting (on every process of a job) before anything is written.
    uint64_t hash = 0;
    nabla::Safetensors loaded;
    int64_t steps = -1;
    std::vector<nabla::Tensor> params;
    std::vector<const nabla::Tensor*> values;
    std::vector<std::pair<std::string, nabla::Tensor>> moments;  // under the optimizer's own slot names
    const std::exception_ptr error = attempt([&] {
      loaded = nabla::load_safetensors(file);
      auto steps_entry = loaded.metadata.find(kOptimizerSteps);
      if (steps_entry != loaded.metadata.end()) {
        const std::string& text = steps_entry->second;
        if (!text.empty() && text.size() < 19 && text.find_first_not_of("0123456789") == std::string::npos)
          steps = std::stoll(text);
      }
      if (steps < 0) throw nabla::IoError(file + ": no optimizer step count (metadata \"" + kOptimizerSteps + "\")");
      hash = nabla::dist::fingerprint(&steps, sizeof steps);
      auto add = [&](const nabla::Tensor& t) -> const nabla::Tensor& {
        hash = nabla::dist::fingerprint(t.data(), size_t(t.numel()) * nabla::dtype_size(t.dtype()), hash);
        return t;
      };
      for (size_t i = 0; i < wanted.size(); ++i) {
        const auto& slot = slots[i];
        params.push_back(slot.param);
        values.push_back(&add(stored_like(loaded, file, wanted[i], slot.param)));
        for (const char* moment : kMoments) {
          moments.emplace_back(moment + slot.name, add(stored_like(loaded, file, moment + wanted[i], slot.param)));
        }
      }
    });
    agree_before_changing(trainer->job.get(), error, hash, "nabla_trainer_load: " + file,
                          "could not read the checkpoint it names; nothing was changed");
    write_leaves(params, values);
    step.load_optimizer_state(moments, steps);  // a sharded step keeps its part
  });
}

nabla_status nabla_trainer_steps(nabla_trainer* trainer, int64_t* out) {
  return guard([&] {
    Call c{"nabla_trainer_steps"};
    *c.need(out, "out") = c.need(trainer, "trainer")->step->optimizer().steps();
  });
}

void nabla_trainer_free(nabla_trainer* trainer) {
  if (!trainer) return;
  auto& owned = trainer->ctx->trainers;
  for (auto it = owned.begin(); it != owned.end(); ++it) {
    if (it->get() == trainer) {
      owned.erase(it);
      return;
    }
  }
}

nabla_status nabla_finetune_create(const char* base, const char* adapter_dir, int64_t lora_r, double lora_alpha,
                                   double lora_dropout, int flags, const char* lora_targets, int64_t batch,
                                   int64_t context, double weight_decay, int threads, uint64_t seed,
                                   nabla_finetune** out) {
  return guard([&] {
    const Call c{"nabla_finetune_create"};
    c.need(base, "base");
    c.need(out, "out");
    *out = nullptr;
    if (lora_r < 0) c.argument_error("lora_r is negative (" + std::to_string(lora_r) + ")");
    if (batch < 1 || context < 0) c.argument_error("batch must be at least 1 and context not negative");
    nabla::models::FinetuneConfig fc;
    fc.lora.r = lora_r;
    fc.lora.alpha = lora_alpha;
    fc.lora.dropout = lora_dropout;
    constexpr int known = NABLA_FINETUNE_RSLORA | NABLA_FINETUNE_GRADIENT_CHECKPOINTING | NABLA_FINETUNE_DEQUANTIZE_BASE |
                          NABLA_FINETUNE_JOB | NABLA_FINETUNE_SHARD_OPTIMIZER | NABLA_FINETUNE_DORA |
                          NABLA_FINETUNE_REPLICAS(255);
    if (flags & ~known) c.argument_error("flags " + std::to_string(flags) + " has bits no NABLA_FINETUNE_* option uses");
    if ((flags & NABLA_FINETUNE_SHARD_OPTIMIZER) && !(flags & NABLA_FINETUNE_JOB)) {
      c.argument_error("NABLA_FINETUNE_SHARD_OPTIMIZER shards the moments over a job's processes: add NABLA_FINETUNE_JOB");
    }
    fc.lora.rslora = flags & NABLA_FINETUNE_RSLORA;
    fc.lora.dora = flags & NABLA_FINETUNE_DORA;
    fc.gradient_checkpointing = flags & NABLA_FINETUNE_GRADIENT_CHECKPOINTING;
    fc.keep_stored = !(flags & NABLA_FINETUNE_DEQUANTIZE_BASE);
    if (lora_targets && *lora_targets) {
      std::string list = lora_targets;
      for (size_t at = 0; at <= list.size();) {
        const size_t comma = std::min(list.find(',', at), list.size());
        if (comma > at) fc.lora.targets.push_back(list.substr(at, comma - at));
        at = comma + 1;
      }
    }  // none: every projection of the base's model type
    fc.batch = batch;
    fc.context = context;
    fc.adamw.weight_decay = weight_decay;
    fc.exec.threads = threads > 0 ? threads : 0;
    fc.seed = seed;
    auto ft = std::make_unique<nabla_finetune>();
    ft->seed = seed;
    if (flags & NABLA_FINETUNE_JOB) ft->job = joined_job(c.fn, "NABLA_FINETUNE_JOB");
    fc.replicas = std::max(1, (flags >> 8) & 255);
    fc.comm = ft->job ? ft->job->step_comm() : nullptr;
    fc.shard_optimizer = (flags & NABLA_FINETUNE_SHARD_OPTIMIZER) != 0;
    ft->session = std::make_unique<nabla::models::FinetuneSession>(base, fc, adapter_dir ? adapter_dir : "");
    for (int r = 0; r < ft->session->step().replicas(); ++r) ft->replicas.push_back(ft->session->replica(r));
    ft->tokenizer = nabla::make_tokenizer(
        nabla::models::checkpoint_tokenizer(base, ft->session->config().tokenizer), "");
    ft->base = base;
    *out = ft.release();
  });
}

nabla_status nabla_finetune_shape(nabla_finetune* ft, int64_t* batch, int64_t* context, int64_t* vocab,
                                  int64_t* trained) {
  return guard([&] {
    const Call c{"nabla_finetune_shape"};
    const nabla::models::FinetuneSession& s = *c.need(ft, "ft")->session;
    if (batch) *batch = s.input_ids.dim(0) * int64_t(ft->replicas.size());
    if (context) *context = s.settings().context;
    if (vocab) *vocab = s.config().vocab_size;
    if (trained) *trained = ft->session->trained().count();
  });
}

nabla_status nabla_finetune_encode(nabla_finetune* ft, const char* text, int32_t* ids, int64_t capacity,
                                   int64_t* count) {
  return guard([&] {
    const Call c{"nabla_finetune_encode"};
    c.need(ft, "ft");
    c.need(text, "text");
    c.need(count, "count");
    if (capacity < 0) c.argument_error("capacity is negative");
    if (capacity > 0) c.need(ids, "ids");
    const std::vector<int32_t> encoded = ft->tokenizer->encode(text);
    *count = int64_t(encoded.size());
    std::copy_n(encoded.begin(), std::min<int64_t>(capacity, *count), ids);
  });
}

nabla_status nabla_finetune_encode_example(nabla_finetune* ft, const char* line, const char* chat_template,
                                           int32_t* ids, int32_t* labels, int64_t capacity, int64_t* count) {
  return guard([&] {
    const Call c{"nabla_finetune_encode_example"};
    c.need(ft, "ft");
    c.need(line, "line");
    c.need(count, "count");
    if (capacity < 0) c.argument_error("capacity is negative");
    if (capacity > 0) {
      c.need(ids, "ids");
      c.need(labels, "labels");
    }
    const nabla::FinetuneExample example =
        as_argument_error(c, [&] { return nabla::finetune_example(line, *ft->tokenizer, chat_options(ft, chat_template)); });
    *count = int64_t(example.ids.size());
    const int64_t n = std::min<int64_t>(capacity, *count);
    std::copy_n(example.ids.begin(), n, ids);
    std::copy_n(example.labels.begin(), n, labels);
  });
}

nabla_status nabla_finetune_encode_prompt(nabla_finetune* ft, const char* line, const char* chat_template,
                                          int32_t* ids, int64_t capacity, int64_t* count) {
  return guard([&] {
    const Call c{"nabla_finetune_encode_prompt"};
    c.need(ft, "ft");
    c.need(line, "line");
    c.need(count, "count");
    if (capacity < 0) c.argument_error("capacity is negative");
    if (capacity > 0) c.need(ids, "ids");
    const std::vector<int32_t> prompt =
        as_argument_error(c, [&] { return nabla::finetune_prompt(line, *ft->tokenizer, chat_options(ft, chat_template)); });
    *count = int64_t(prompt.size());
    std::copy_n(prompt.begin(), std::min<int64_t>(capacity, *count), ids);
  });
}

nabla_status nabla_finetune_generate(nabla_finetune* ft, const int32_t* prompt, int64_t prompt_count,
                                     int64_t max_tokens, double temperature, int64_t top_k, double top_p,
                                     uint64_t seed, int flags, int32_t* out, float* logprobs, int64_t* generated) {
  return guard([&] {
    const Call c{"nabla_finetune_generate"};
    c.need(ft, "ft");
    c.need(generated, "generated");
    if (prompt_count < 1) c.argument_error("prompt_count is " + std::to_string(prompt_count) + ", expected >= 1");
    c.need(prompt, "prompt");
    if (max_tokens < 1) c.argument_error("max_tokens is " + std::to_string(max_tokens) + ", expected >= 1");
    c.need(out, "out");
    if (top_k < 0 || top_k > INT32_MAX) c.argument_error("top_k is " + std::to_string(top_k) + ", expected >= 0");
    if (flags & ~NABLA_GENERATE_IGNORE_EOS) {
      c.argument_error("flags " + std::to_string(flags) + " has bits no NABLA_GENERATE_* option uses");
    }
    const nabla::models::GenerateOptions options{
        .max_new_tokens = max_tokens,
        .sampling = {.temperature = temperature, .top_k = int(top_k), .top_p = top_p},
        .seed = seed,
        .stop = (flags & NABLA_GENERATE_IGNORE_EOS) ? std::vector<int32_t>{}
                                                    : nabla::end_of_generation_ids(*ft->tokenizer),
        .exec = ft->session->settings().exec};
    const nabla::models::Generation g = as_argument_error(c, [&] {
      return nabla::models::generate(ft->session->model(), std::span<const int32_t>(prompt, size_t(prompt_count)),
                                     options);
    });
    std::copy(g.tokens.begin(), g.tokens.end(), out);
    if (logprobs) std::copy(g.logprobs.begin(), g.logprobs.end(), logprobs);
    *generated = int64_t(g.tokens.size());
  });
}

nabla_status nabla_finetune_decode(nabla_finetune* ft, const int32_t* ids, int64_t count, char* text,
                                   int64_t capacity, int64_t* length) {
  return guard([&] {
    const Call c{"nabla_finetune_decode"};
    c.need(ft, "ft");
    c.need(length, "length");
    if (count < 0 || capacity < 0) c.argument_error("count and capacity must not be negative");
    if (count > 0) c.need(ids, "ids");
    if (capacity > 0) c.need(text, "text");
    const std::string decoded =
        as_argument_error(c, [&] { return ft->tokenizer->decode(std::span<const int32_t>(ids, size_t(count))); });
    *length = int64_t(decoded.size());
    const int64_t n = std::min<int64_t>(capacity, *length);
    std::copy_n(decoded.begin(), n, text);
    if (n < capacity) text[n] = '\0';
  });
}

nabla_status nabla_finetune_step(nabla_finetune* ft, const int32_t* input_ids, const int32_t* labels,
                                 const int32_t* segments, double lr, double clip, float* loss) {
  return guard([&] {
    const Call c{"nabla_finetune_step"};
    nabla::models::FinetuneSession& s = *c.need(ft, "ft")->session;
    const int64_t rows = s.input_ids.dim(0), T = s.input_ids.dim(1), n = rows * T, vocab = s.config().vocab_size;
    const auto replicas = int64_t(ft->replicas.size());
    // Checked on every process of a job before any takes the step, which
    // would otherwise wait for the one that refused its batch.
    agree_before_changing(ft->job.get(), attempt([&] {
      c.need(input_ids, "input_ids");
      c.need(labels, "labels");
      if (!(lr >= 0) || !(clip >= 0)) c.argument_error("lr and clip must be non-negative numbers");
      // Ids outside the vocabulary would index past the embedding.
      for (int64_t i = 0; i < n * replicas; ++i) {
        if (input_ids[i] < 0 || input_ids[i] >= vocab || (labels[i] != -100 && (labels[i] < 0 || labels[i] >= vocab))) {
          throw nabla::ShapeError("nabla_finetune_step: element " + std::to_string(i) + " holds id " +
                                  std::to_string(input_ids[i]) + " / label " + std::to_string(labels[i]) +
                                  ", expected ids in [0, " + std::to_string(vocab) + ") and labels there or -100");
        }
      }
    }), 0, c.fn, "refused its batch or arguments; no process took the step");
    // Each replica's loss is the mean over its rows' counted tokens (labels
    // after a row's first, which nothing predicts); weighted by its share of
    // the step's, the step's gradient is that of the mean over all of them.
    std::vector<double> counted(size_t(replicas) + 1, 0.0);  // per replica, then the step's (every process's)
    for (int64_t r = 0; r < replicas; ++r) {
      for (int64_t b = r * rows; b < (r + 1) * rows; ++b) {
        counted[size_t(r)] += double(std::count_if(labels + b * T + 1, labels + (b + 1) * T, [](int32_t l) { return l != -100; }));
      }
      counted.back() += counted[size_t(r)];
    }
    if (nabla::dist::Communicator* comm = ft->job ? ft->job->step_comm() : nullptr) {
      std::vector<double> all(size_t(comm->size()));
      comm->all_gather_bytes(&counted.back(), all.data(), sizeof(double));
      counted.back() = 0;
      for (double v : all) counted.back() += v;
    }
    const nabla::TrainStep& step = s.step();
    const int32_t step_seed = int32_t((ft->seed * 0x9e3779b97f4a7c15ull + uint64_t(ft->steps)) >> 33);
    for (int64_t r = 0; r < replicas; ++r) {
      nabla::models::FinetuneSession::Inputs& in = ft->replicas[size_t(r)];
      const size_t bytes = size_t(n) * sizeof(int32_t);
      in.input_ids.copy_from(input_ids + r * n, bytes);
      in.labels.copy_from(labels + r * n, bytes);
      if (segments) {
        in.segments.copy_from(segments + r * n, bytes);
      } else {
        std::fill_n(in.segments.data_as<int32_t>(), n, 0);
      }
      const double parts = double(step.global_replicas());
      in.loss_weight.data_as<float>()[0] = counted.back() > 0 ? float(counted[size_t(r)] * parts / counted.back()) : 0.0f;
      if (in.dropout_seed.defined()) {
        in.dropout_seed.data_as<int32_t>()[0] = nabla::replica_seed(step_seed, step.global_replica(int(r)));
      }
    }
    const float value = s.run();
    s.update(lr, clip);
    ++ft->steps;
    if (loss) *loss = value;
  });
}

nabla_status nabla_finetune_save(nabla_finetune* ft, const char* dir) {
  return guard([&] {
    const Call c{"nabla_finetune_save"};
    c.need(ft, "ft");
    c.need(dir, "dir");
    const Job* job = ft->job.get();
    share_outcome(job, writes_for_job(job) ? attempt([&] { ft->session->save(dir); }) : nullptr, std::string("nabla_finetune_save: ") + dir);
  });
}

nabla_status nabla_finetune_save_gguf(nabla_finetune* ft, const char* path) {
  return guard([&] {
    const Call c{"nabla_finetune_save_gguf"};
    c.need(ft, "ft");
    c.need(path, "path");
    const Job* job = ft->job.get();
    share_outcome(job, writes_for_job(job) ? attempt([&] { ft->session->save_gguf_adapter(path); }) : nullptr, std::string("nabla_finetune_save_gguf: ") + path);
  });
}

void nabla_finetune_free(nabla_finetune* ft) { delete ft; }

}  // extern "C"
