"""Drives libnabla.so through ctypes, exactly as an FFI user would.

Usage: ctypes_test.py path/to/libnabla.so

Builds a small MLP in f64, runs backward and compute, reads gradients into
ctypes arrays and checks them against central finite differences computed
through the same API (rewriting a parameter leaf with nabla_tensor_write and
recomputing). Then checks error paths: status codes and nabla_last_error.
Standard library only.

Dimensions: N samples, D inputs, H hidden units.
  x [N, D], y [N, 1], w1 [D, H], b1 [H], w2 [H, 1]
  loss = mean((tanh(x w1 + b1) w2 - y)^2)
"""
import ctypes
import math
import random
import sys

# Status codes and dtypes, as in nabla.h.
NABLA_OK = 0
NABLA_ERROR_SHAPE = 1
NABLA_ERROR_DTYPE = 2
NABLA_ERROR_USAGE = 4
NABLA_ERROR_ARGUMENT = 6
NABLA_F32, NABLA_F64, NABLA_I32 = 0, 1, 2

N, D, H = 8, 3, 4


class NablaError(Exception):
    def __init__(self, status, message):
        super().__init__(f"status {status}: {message}")
        self.status = status
        self.message = message


def load(path):
    lib = ctypes.CDLL(path)
    ctx_p = ctypes.c_void_p
    t_p = ctypes.c_void_p
    t_pp = ctypes.POINTER(ctypes.c_void_p)
    i64_p = ctypes.POINTER(ctypes.c_int64)
    status = ctypes.c_int
    sigs = {
        "nabla_last_error": (ctypes.c_char_p, []),
        "nabla_status_string": (ctypes.c_char_p, [ctypes.c_int]),
        "nabla_context_create": (status, [ctypes.POINTER(ctx_p)]),
        "nabla_context_free": (None, [ctx_p]),
        "nabla_tensor_from_data": (status, [ctx_p, ctypes.c_int, ctypes.c_int, i64_p, ctypes.c_void_p, t_pp]),
        "nabla_parameter": (status, [ctx_p, ctypes.c_int, ctypes.c_int, i64_p, ctypes.c_void_p, t_pp]),
        "nabla_tensor_write": (status, [ctx_p, t_p, ctypes.c_void_p, ctypes.c_size_t]),
        "nabla_tensor_read": (status, [ctx_p, t_p, ctypes.c_void_p, ctypes.c_size_t]),
        "nabla_tensor_rank": (status, [t_p, ctypes.POINTER(ctypes.c_int)]),
        "nabla_tensor_shape": (status, [t_p, i64_p, ctypes.c_int]),
        "nabla_tensor_dtype": (status, [t_p, ctypes.POINTER(ctypes.c_int)]),
        "nabla_tensor_numel": (status, [t_p, i64_p]),
        "nabla_add": (status, [ctx_p, t_p, t_p, t_pp]),
        "nabla_sub": (status, [ctx_p, t_p, t_p, t_pp]),
        "nabla_matmul": (status, [ctx_p, t_p, t_p, t_pp]),
        "nabla_tanh": (status, [ctx_p, t_p, t_pp]),
        "nabla_square": (status, [ctx_p, t_p, t_pp]),
        "nabla_mean": (status, [ctx_p, t_p, i64_p, ctypes.c_int, ctypes.c_int, t_pp]),
        "nabla_backward": (status, [ctx_p, t_p]),
        "nabla_grad": (status, [ctx_p, t_p, t_pp]),
        "nabla_compute": (status, [ctx_p, t_pp, ctypes.c_size_t, ctypes.c_int]),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


class Api:
    """A thin Pythonic layer: raises NablaError on a non-zero status."""

    def __init__(self, lib):
        self.lib = lib
        self.ctx = ctypes.c_void_p()
        self.check(lib.nabla_context_create(ctypes.byref(self.ctx)))

    def close(self):
        self.lib.nabla_context_free(self.ctx)

    def check(self, status):
        if status != NABLA_OK:
            raise NablaError(status, self.lib.nabla_last_error().decode())

    def leaf(self, shape, values, parameter=False):
        dims = (ctypes.c_int64 * len(shape))(*shape)
        data = (ctypes.c_double * len(values))(*values)
        out = ctypes.c_void_p()
        make = self.lib.nabla_parameter if parameter else self.lib.nabla_tensor_from_data
        self.check(make(self.ctx, NABLA_F64, len(shape), dims, data, ctypes.byref(out)))
        return out

    def op(self, name, *args):
        out = ctypes.c_void_p()
        self.check(getattr(self.lib, "nabla_" + name)(self.ctx, *args, ctypes.byref(out)))
        return out

    def numel(self, t):
        n = ctypes.c_int64()
        self.check(self.lib.nabla_tensor_numel(t, ctypes.byref(n)))
        return n.value

    def shape(self, t):
        rank = ctypes.c_int()
        self.check(self.lib.nabla_tensor_rank(t, ctypes.byref(rank)))
        dims = (ctypes.c_int64 * max(rank.value, 1))()
        self.check(self.lib.nabla_tensor_shape(t, dims, rank.value))
        return list(dims[: rank.value])

    def read(self, t):
        buf = (ctypes.c_double * self.numel(t))()
        self.check(self.lib.nabla_tensor_read(self.ctx, t, buf, ctypes.sizeof(buf)))
        return list(buf)

    def write(self, t, values):
        buf = (ctypes.c_double * len(values))(*values)
        self.check(self.lib.nabla_tensor_write(self.ctx, t, buf, ctypes.sizeof(buf)))

    def compute(self, outputs, threads=1):
        arr = (ctypes.c_void_p * len(outputs))(*[o.value for o in outputs])
        self.check(self.lib.nabla_compute(self.ctx, arr, len(outputs), threads))


failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def test_gradients(api):
    rng = random.Random(7)
    xs = [rng.uniform(-1, 1) for _ in range(N * D)]
    ys = [math.sin(xs[i * D]) + 0.3 * xs[i * D + 1] for i in range(N)]
    w1v = [rng.uniform(-1, 1) for _ in range(D * H)]
    b1v = [rng.uniform(-0.5, 0.5) for _ in range(H)]
    w2v = [rng.uniform(-1, 1) for _ in range(H)]

    x = api.leaf([N, D], xs)
    y = api.leaf([N, 1], ys)
    w1 = api.leaf([D, H], w1v, parameter=True)
    b1 = api.leaf([H], b1v, parameter=True)
    w2 = api.leaf([H, 1], w2v, parameter=True)
    hidden = api.op("tanh", api.op("add", api.op("matmul", x, w1), b1))  # [N, H]
    pred = api.op("matmul", hidden, w2)  # [N, 1]
    loss = api.op("mean", api.op("square", api.op("sub", pred, y)), None, 0, 0)  # []
    expect(api.shape(pred) == [N, 1], f"pred shape {api.shape(pred)}")
    expect(api.shape(loss) == [], f"loss shape {api.shape(loss)}")
    dtype = ctypes.c_int()
    api.check(api.lib.nabla_tensor_dtype(loss, ctypes.byref(dtype)))
    expect(dtype.value == NABLA_F64, f"loss dtype {dtype.value}")

    api.check(api.lib.nabla_backward(api.ctx, loss))
    dw1 = api.op("grad", w1)
    db1 = api.op("grad", b1)
    dw2 = api.op("grad", w2)
    expect(api.shape(dw1) == [D, H], f"dw1 shape {api.shape(dw1)}")
    api.compute([loss])
    base_loss = api.read(loss)[0]
    print(f"loss {base_loss:.8f}")
    # Read every gradient now: values are those of the last compute, and the
    # finite differences below recompute with perturbed weights.
    analytic = {name: api.read(grad) for grad, name in ((dw1, "w1"), (db1, "b1"), (dw2, "w2"))}

    # Central differences through the same API: rewrite one entry of a
    # parameter leaf, recompute (the cached plan is reused), read the loss.
    step = 1e-6
    worst = 0.0
    for param, values, name in ((w1, w1v, "w1"), (b1, b1v, "b1"), (w2, w2v, "w2")):
        for i in range(len(values)):
            def loss_at(v):
                changed = list(values)
                changed[i] = v
                api.write(param, changed)
                api.compute([loss])
                return api.read(loss)[0]

            numeric = (loss_at(values[i] + step) - loss_at(values[i] - step)) / (2 * step)
            api.write(param, values)
            err = abs(analytic[name][i] - numeric) / (1e-8 + 1e-6 * abs(numeric))
            worst = max(worst, err)
            expect(err <= 1.0, f"d{name}[{i}]: analytic {analytic[name][i]:.10g}, numeric {numeric:.10g}")
    print(f"gradients match finite differences (worst scaled error {worst:.3g})")

    # The restored weights give the original loss back.
    api.compute([loss])
    expect(abs(api.read(loss)[0] - base_loss) < 1e-14, "loss after restoring the weights")

    # A few SGD steps on the host lower the loss.
    params = [(w1, list(w1v), dw1), (b1, list(b1v), db1), (w2, list(w2v), dw2)]
    for _ in range(30):
        api.compute([loss])
        for param, values, grad in params:
            g = api.read(grad)
            for i in range(len(values)):
                values[i] -= 0.2 * g[i]
            api.write(param, values)
    api.compute([loss])
    trained = api.read(loss)[0]
    print(f"loss after 30 SGD steps {trained:.8f}")
    expect(trained < 0.7 * base_loss, "SGD lowers the loss")


def test_errors(api):
    lib = api.lib
    a = api.leaf([4, 5], [0.0] * 20)
    b = api.leaf([6, 3], [0.0] * 18)
    out = ctypes.c_void_p()
    status = lib.nabla_matmul(api.ctx, a, b, ctypes.byref(out))
    message = lib.nabla_last_error().decode()
    print(f"matmul error: {lib.nabla_status_string(status).decode()}: {message}")
    expect(status == NABLA_ERROR_SHAPE, f"matmul status {status}")
    expect(message == "matmul: inner dimensions differ: a is [4, 5], b is [6, 3]", f"matmul message {message!r}")
    expect(out.value is None, "out is untouched on error")

    status = lib.nabla_add(None, a, b, ctypes.byref(out))
    expect(status == NABLA_ERROR_ARGUMENT, f"NULL ctx status {status}")
    expect("nabla_add" in lib.nabla_last_error().decode(), "NULL ctx message names the function")

    # A buffer of the wrong size is refused, not overrun.
    small = (ctypes.c_double * 3)()
    status = lib.nabla_tensor_read(api.ctx, a, small, ctypes.sizeof(small))
    expect(status == NABLA_ERROR_SHAPE, f"short read status {status}")
    expect("needs 160 bytes" in lib.nabla_last_error().decode(), "short read message")

    # Only parameters have gradients.
    try:
        api.op("grad", a)
        expect(False, "grad of a non-parameter succeeds")
    except NablaError as e:
        expect(e.status == NABLA_ERROR_USAGE, f"grad of a non-parameter status {e.status}")
        print(f"grad error: {e.message}")

    # Integer parameters are refused.
    dims = (ctypes.c_int64 * 1)(2)
    status = lib.nabla_parameter(api.ctx, NABLA_I32, 1, dims, None, ctypes.byref(out))
    expect(status == NABLA_ERROR_DTYPE, f"i32 parameter status {status}")


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    api = Api(load(sys.argv[1]))
    try:
        test_gradients(api)
        test_errors(api)
    finally:
        api.close()
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
