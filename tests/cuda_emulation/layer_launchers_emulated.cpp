// The launchers of megazero/cuda/layernorm.cu and dropout.cu, whole, on the
// CPU: the .cu files themselves (and the launching headers they include),
// with each `kernel<<<...>>>(...)` rewritten by rewrite_launches.py into a
// checked emulated launch (shim/emu_host.h), called through their public
// headers with device memory that the host cannot touch outside a kernel and
// that ends at a guard page. What the kernel-level tests cannot see is what
// this runs: the launcher's choice of kernel instance (packs a thread, the
// fast or general path, fused or not, prefetched), its grid and block, its
// shared-memory size and attribute call (the prefetched two-pack backward
// asks for 208 KB), the scratch it carves from the bytes gpu_scratch.h
// prescribes (allocated exactly, so an overrun faults), its fallbacks for
// unaligned operands and layouts whose rows are not the tensor's, and the
// order of its passes. Each result is compared with the CPU kernels of
// megazero/kernels on the same inputs:
// - layernorm_forward and bias_dropout_add_layernorm: y within two storage
//   roundings plus 1e-5 of the row's scale (fp32 statistics on the fast
//   path), mean/rstd within 1e-5 relative; the bias-dropout-add's sum bit for bit;
// - layernorm_backward (Auto, Split, OnePassPrefetched; fp32 and storage
//   accumulators; with and without the residual gradient) and
//   layernorm_backward_dropout (with and without the bias gradient, prefetched
//   or not): dx within two storage roundings plus 1e-5 of its largest value;
//   dd bit for bit against the CPU's dropout backward of the launcher's own
//   dx; dgamma/dbeta/dbias within one accumulator rounding plus (rows + 8)
//   fp32 roundings of the column's sum of |term|;
// - dropout, bias_dropout_add, dropout_backward_bias_grad: bit for bit (dbias
//   within the sums' bound); the last with its bias sums finished in the
//   kernel (one launch) and with MEGAZERO_COLUMN_FINISH=kernel (two): the
//   same bits.
// Also the emulation's own rules, so a launcher that breaks one is known to
// fail here: a launch over 48 KB of shared memory without the attribute is
// refused, and host code reading device memory dies of SIGSEGV.
// Exit code 1 on any failure.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "emu_checks.h"
#include "emu_device_checks.h"
#include "emu_host.h"
#include "megazero/cuda/dropout.h"
#include "megazero/cuda/layernorm.h"
#include "megazero/kernels/dropout.h"
#include "megazero/kernels/gelu_bias.h"
#include "megazero/kernels/gpu_scratch.h"
#include "megazero/kernels/layernorm.h"

using namespace megazero;
using namespace emu_checks;
using namespace emu_device_checks;
namespace gs = megazero::kernels::gpu_scratch;
using Passes = kernels::LayerNormBackwardPasses;

namespace {

// The layouts: a hidden-state one (the tensor's rows are the layout's rows,
// other groups' rows in between) and one whose rows are half a tensor row
// (the fused launchers must fall back to their two-call forms).
kernels::DropoutLayout hidden_layout(i64 rows, i64 cols) { return {rows, 1, 1, cols, 7, 2, 3}; }
kernels::DropoutLayout split_layout(i64 rows, i64 cols) { return {rows, 1, 2, cols / 2, 3, 0, 1}; }
// Layout rows of two tensor rows each (rows even).
kernels::DropoutLayout paired_layout(i64 rows, i64 cols) { return {rows / 2, 1, 2, cols, 5, 0, 1}; }
enum class Layout { Hidden, HalfRows, Paired };
kernels::DropoutLayout layout_of(Layout l, i64 rows, i64 cols) {
  return l == Layout::Hidden     ? hidden_layout(rows, cols)
         : l == Layout::HalfRows ? split_layout(rows, cols)
                                 : paired_layout(rows, cols);
}

const RngKey kKey{2026, 11, 3, kRngAttentionOutputDropout};

// ------------------------------------------------------------ forward
void forward(DType t, i64 rows, i64 cols, std::size_t shift, std::mt19937& rng) {
  const Tensor x = tensor_of({rows, cols}, randn(rows * cols, rng, 2.0), t);
  const Tensor gamma = tensor_of({cols}, randn(cols, rng), t), beta = tensor_of({cols}, randn(cols, rng), t);
  const DType stat = t == DType::F64 ? DType::F64 : DType::F32;
  Tensor y = Tensor::zeros(cpu(), {rows, cols}, t, MemoryCategory::Other);
  Tensor mean = Tensor::zeros(cpu(), {rows}, stat, MemoryCategory::Other), rstd = mean.clone(MemoryCategory::Other);
  kernels::layernorm_forward(x, gamma, beta, 1e-5, y, mean, rstd);

  const auto dx = put(x, shift), dg = put(gamma), db = put(beta), dy = poisoned(y), dm = poisoned(mean),
             dr = poisoned(rstd);
  cuda::layernorm_forward(t, dx.ptr(), dg.ptr(), db.ptr(), 1e-5, dy.ptr(), dm.ptr(), dr.ptr(), rows, cols, nullptr);
  expect_rows(get(dy, y), y, "layernorm_forward y");
  expect_close(values(get(dm, mean)), values(mean), 1e-5, 1e-6, "layernorm_forward mean");
  expect_close(values(get(dr, rstd)), values(rstd), 1e-5, 0, "layernorm_forward rstd");
}

void bda_forward(DType t, i64 rows, i64 cols, bool hidden, std::size_t shift, std::mt19937& rng) {
  const Tensor y = tensor_of({rows, cols}, randn(rows * cols, rng), t),
               res = tensor_of({rows, cols}, randn(rows * cols, rng), t);
  const Tensor bias = tensor_of({cols}, randn(cols, rng), t);
  const Tensor gamma = tensor_of({cols}, randn(cols, rng), t), beta = tensor_of({cols}, randn(cols, rng), t);
  const auto layout = hidden ? hidden_layout(rows, cols) : split_layout(rows, cols);
  const double p = 0.1;
  Tensor sum = Tensor::zeros(cpu(), {rows, cols}, t, MemoryCategory::Other), y_ln = sum.clone(MemoryCategory::Other);
  Tensor mean = Tensor::zeros(cpu(), {rows}, DType::F32, MemoryCategory::Other),
         rstd = mean.clone(MemoryCategory::Other);
  kernels::bias_dropout_add(y, bias, res, p, kKey, layout, sum);
  kernels::layernorm_forward(sum, gamma, beta, 1e-5, y_ln, mean, rstd);

  const auto dy = put(y, shift), dres = put(res), dbias = put(bias), dg = put(gamma), db = put(beta);
  const auto dsum = poisoned(sum), dln = poisoned(y_ln), dm = poisoned(mean), dr = poisoned(rstd);
  cuda::bias_dropout_add_layernorm(t, dy.ptr(), dbias.ptr(), dres.ptr(), p, kKey, layout, dsum.ptr(), dg.ptr(),
                                   db.ptr(), 1e-5, dln.ptr(), dm.ptr(), dr.ptr(), rows, cols, nullptr);
  expect_bits(get(dsum, sum), sum, "bias_dropout_add_layernorm sum");
  expect_rows(get(dln, y_ln), y_ln, "bias_dropout_add_layernorm y");
  expect_close(values(get(dr, rstd)), values(rstd), 1e-5, 0, "bias_dropout_add_layernorm rstd");
}

// ------------------------------------------------------------ backward
struct Backward {
  DType t;
  i64 rows, cols;
  DType acc;
  bool add;
  std::size_t shift;  // of dy: an unaligned operand
};

struct BackwardInputs {
  Tensor x, dy, gamma, res, mean, rstd, g0, b0;
  std::vector<double> mag_g, mag_b;
};

BackwardInputs inputs(const Backward& c, std::mt19937& rng) {
  const i64 rows = c.rows, cols = c.cols;
  BackwardInputs in;
  in.x = tensor_of({rows, cols}, randn(rows * cols, rng, 2.0), c.t);
  in.dy = tensor_of({rows, cols}, randn(rows * cols, rng), c.t);
  in.gamma = tensor_of({cols}, randn(cols, rng), c.t);
  in.res = tensor_of({rows, cols}, randn(rows * cols, rng), c.t);
  const Tensor beta = tensor_of({cols}, randn(cols, rng), c.t);
  Tensor y = in.x.clone(MemoryCategory::Other);
  const DType stat = c.t == DType::F64 ? DType::F64 : DType::F32;
  in.mean = Tensor::zeros(cpu(), {rows}, stat, MemoryCategory::Other);
  in.rstd = in.mean.clone(MemoryCategory::Other);
  kernels::layernorm_forward(in.x, in.gamma, beta, 1e-5, y, in.mean, in.rstd);
  in.g0 = tensor_of({cols}, randn(cols, rng), c.acc);
  in.b0 = tensor_of({cols}, randn(cols, rng), c.acc);
  const auto xs = values(in.x), ds = values(in.dy), ms = values(in.mean), rs = values(in.rstd);
  in.mag_g = values(in.g0);
  in.mag_b = values(in.b0);
  for (auto& v : in.mag_g) v = std::fabs(v);
  for (auto& v : in.mag_b) v = std::fabs(v);
  for (i64 r = 0; r < rows; ++r)
    for (i64 k = 0; k < cols; ++k) {
      const auto i = static_cast<std::size_t>(r * cols + k), col = static_cast<std::size_t>(k);
      in.mag_b[col] += std::fabs(ds[i]);
      in.mag_g[col] += std::fabs(ds[i] * (xs[i] - ms[static_cast<std::size_t>(r)]) * rs[static_cast<std::size_t>(r)]);
    }
  return in;
}

void backward(const Backward& c, Passes passes, std::mt19937& rng) {
  const auto in = inputs(c, rng);
  Tensor dx = Tensor::zeros(cpu(), {c.rows, c.cols}, c.t, MemoryCategory::Other);
  Tensor dgamma = in.g0.clone(MemoryCategory::Other), dbeta = in.b0.clone(MemoryCategory::Other);
  kernels::layernorm_backward(in.dy, in.x, in.gamma, in.mean, in.rstd, dx, dgamma, dbeta, c.add ? &in.res : nullptr);

  const auto ddy = put(in.dy, c.shift), dxx = put(in.x), dg = put(in.gamma), dm = put(in.mean), dr = put(in.rstd),
             dres = put(in.res), ddx = poisoned(dx, c.shift), dgam = put(in.g0), dbet = put(in.b0);
  const auto ws = scratch(gs::layernorm_backward_bytes(c.t, c.rows, c.cols));
  cuda::layernorm_backward(c.t, ddy.ptr(), dxx.ptr(), dg.ptr(), dm.ptr(), dr.ptr(), ddx.ptr(), dgam.ptr(), c.acc,
                           dbet.ptr(), c.acc, c.add ? dres.ptr() : nullptr, c.rows, c.cols, passes, ws.ws(), nullptr);
  expect_rows(get(ddx, dx), dx, "layernorm_backward dx");
  expect_sums(get(dgam, dgamma), dgamma, in.mag_g, c.rows, "layernorm_backward dgamma");
  expect_sums(get(dbet, dbeta), dbeta, in.mag_b, c.rows, "layernorm_backward dbeta");
}

void backward_dropout(const Backward& c, bool with_bias, bool prefetch, bool hidden, std::mt19937& rng) {
  const auto in = inputs(c, rng);
  const double p = 0.1;
  const auto layout = hidden ? hidden_layout(c.rows, c.cols) : split_layout(c.rows, c.cols);
  const auto ddy = put(in.dy, c.shift), dxx = put(in.x), dg = put(in.gamma), dm = put(in.mean), dr = put(in.rstd),
             dres = put(in.res), dgam = put(in.g0), dbet = put(in.b0);
  const Tensor like = in.dy;
  const auto ddx = poisoned(like, c.shift), ddd = poisoned(like);
  const Tensor bias0 = tensor_of({c.cols}, randn(c.cols, rng), c.acc);
  const auto dbias = put(bias0);
  const auto ws = scratch(gs::layernorm_dropout_backward_bytes(c.t, c.rows, c.cols));
  cuda::layernorm_backward_dropout(c.t, ddy.ptr(), dxx.ptr(), dg.ptr(), dm.ptr(), dr.ptr(), ddx.ptr(), dgam.ptr(),
                                   dbet.ptr(), c.acc, c.add ? dres.ptr() : nullptr, c.rows, c.cols, p, kKey, layout,
                                   ddd.ptr(), with_bias ? dbias.ptr() : nullptr, prefetch, ws.ws(), nullptr);
  // dx and the parameters' sums: the CPU's layernorm_backward.
  Tensor dx = Tensor::zeros(cpu(), {c.rows, c.cols}, c.t, MemoryCategory::Other);
  Tensor dgamma = in.g0.clone(MemoryCategory::Other), dbeta = in.b0.clone(MemoryCategory::Other);
  kernels::layernorm_backward(in.dy, in.x, in.gamma, in.mean, in.rstd, dx, dgamma, dbeta, c.add ? &in.res : nullptr);
  const Tensor got_dx = get(ddx, dx);
  expect_rows(got_dx, dx, "layernorm_backward_dropout dx");
  expect_sums(get(dgam, dgamma), dgamma, in.mag_g, c.rows, "layernorm_backward_dropout dgamma");
  expect_sums(get(dbet, dbeta), dbeta, in.mag_b, c.rows, "layernorm_backward_dropout dbeta");
  // dd: the dropout backward of the launcher's own dx, bit for bit; the bias
  // gradient its column sums.
  Tensor dd = got_dx.clone(MemoryCategory::Other);
  kernels::dropout_backward(got_dx, p, kKey, layout, dd);
  expect_bits(get(ddd, dd), dd, "layernorm_backward_dropout dd");
  std::size_t dropped = 0;
  for (const double v : values(dd)) dropped += v == 0.0;
  check(dropped > 0, "layernorm_backward_dropout: no element dropped", 0, p, 0);
  const Tensor got_bias = get(dbias, bias0);
  if (with_bias) {
    Tensor want = bias0.clone(MemoryCategory::Other);
    kernels::bias_grad(dd, want);
    std::vector<double> mag = values(bias0);
    for (auto& v : mag) v = std::fabs(v);
    const auto ds = values(dd);
    for (std::size_t i = 0; i < ds.size(); ++i) mag[i % static_cast<std::size_t>(c.cols)] += std::fabs(ds[i]);
    expect_sums(got_bias, want, mag, c.rows, "layernorm_backward_dropout dbias");
  } else {
    expect_bits(got_bias, bias0, "layernorm_backward_dropout: dbias untouched");
  }
}

// ------------------------------------------------------------ dropout
void dropouts(DType t, i64 rows, i64 cols, Layout l, std::size_t shift, std::mt19937& rng) {
  const double p = 0.25;
  const auto layout = layout_of(l, rows, cols);
  const Tensor x = tensor_of({rows, cols}, randn(rows * cols, rng), t),
               res = tensor_of({rows, cols}, randn(rows * cols, rng), t);
  const Tensor bias = tensor_of({cols}, randn(cols, rng), t);
  const auto dx = put(x, shift), dres = put(res), dbias = put(bias);

  Tensor y = x.clone(MemoryCategory::Other);
  kernels::dropout_forward(x, p, kKey, layout, y);
  const auto dy = poisoned(y, shift);
  cuda::dropout(t, dx.ptr(), p, kKey, layout, dy.ptr(), nullptr);
  expect_bits(get(dy, y), y, "dropout");

  Tensor out = x.clone(MemoryCategory::Other);
  kernels::bias_dropout_add(x, bias, res, p, kKey, layout, out);
  const auto dout = poisoned(out);
  cuda::bias_dropout_add(t, dx.ptr(), dbias.ptr(), dres.ptr(), p, kKey, layout, dout.ptr(), cols, nullptr);
  expect_bits(get(dout, out), out, "bias_dropout_add");

  for (const DType acc : {DType::F32, t}) {
    const Tensor b0 = tensor_of({cols}, randn(cols, rng), acc);
    Tensor dgrad = x.clone(MemoryCategory::Other), db = b0.clone(MemoryCategory::Other);
    kernels::dropout_backward(x, p, kKey, layout, dgrad);
    kernels::bias_grad(dgrad, db);
    const auto ddg = poisoned(dgrad, shift), ddb = put(b0);
    const auto ws = scratch(gs::dropout_bias_grad_bytes(rows, cols));
    cuda::dropout_backward_bias_grad(t, dx.ptr(), p, kKey, layout, ddg.ptr(), ddb.ptr(), acc, rows, cols, ws.ws(),
                                     nullptr);
    expect_bits(get(ddg, dgrad), dgrad, "dropout_backward_bias_grad dx");
    std::vector<double> mag = values(b0);
    for (auto& v : mag) v = std::fabs(v);
    const auto ds = values(dgrad);
    for (std::size_t i = 0; i < ds.size(); ++i) mag[i % static_cast<std::size_t>(cols)] += std::fabs(ds[i]);
    expect_sums(get(ddb, db), db, mag, rows, "dropout_backward_bias_grad dbias");
    expect_fold_agrees(
        [&] {
          const auto fdg = poisoned(dgrad, shift), fdb = put(b0);
          const auto fws = scratch(gs::dropout_bias_grad_bytes(rows, cols));
          cuda::dropout_backward_bias_grad(t, dx.ptr(), p, kKey, layout, fdg.ptr(), fdb.ptr(), acc, rows, cols,
                                           fws.ws(), nullptr);
          return std::vector<Tensor>{get(fdg, dgrad), get(fdb, db)};
        },
        true, "dropout_backward_bias_grad: folded finish vs its own launch");
  }
}

// ------------------------------------------------------------ the emulation's rules
void touch(float* p) {
  for (int i = 0; i < 64; ++i) p[i] = static_cast<float>(i);
}

void emulation_rules() {
  emu::DeviceBuffer<float> buf(64 * 1024);
  const auto big = [&](std::size_t bytes) {
    emu::launch(emu::LaunchConfig(1, 64, bytes, nullptr), [&] { touch(buf.get()); });
  };
  big(48 << 10);
  check(cudaGetLastError() == cudaSuccess, "a 48 KB launch refused", 0, 0, 0);
  big(64 << 10);
  check(cudaGetLastError() == cudaErrorInvalidValue, "a 64 KB launch without the attribute ran", 0, 0, 0);
  check(cudaFuncSetAttribute(touch, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10) == cudaSuccess,
        "the attribute refused", 0, 0, 0);
  big(64 << 10);
  check(cudaGetLastError() == cudaSuccess, "a 64 KB launch after the attribute refused", 0, 0, 0);
  big(64 << 10);
  check(cudaGetLastError() == cudaErrorInvalidValue, "the attribute outlived its launch", 0, 0, 0);
  emu::launch(emu::LaunchConfig(1, 2048, 0, nullptr), [&] {});
  check(cudaGetLastError() == cudaErrorInvalidConfiguration, "a 2048-thread block ran", 0, 0, 0);
  emu::launch(emu::LaunchConfig(dim3(1, 70000), 32, 0, nullptr), [&] {});
  check(cudaGetLastError() == cudaErrorInvalidConfiguration, "a grid.y of 70000 ran", 0, 0, 0);
  check(buf.download()[5] == 5.0f, "the kernel's writes", buf.download()[5], 5, 0);
  // Host code touching device memory: SIGSEGV, as the test of a launcher
  // that did so would die. A forked child tries each way in.
  const auto dies = [](auto&& body) {
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      if (!std::freopen("/dev/null", "w", stderr)) _exit(0);
      body();
      _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV;
  };
  check(dies([&] { touch(buf.get()); }), "a host write to device memory did not fault", 0, 0, 0);
  check(dies([&] { std::printf("%g\n", buf.get()[3]); }), "a host read of device memory did not fault", 0, 0, 0);
  check(dies([&] { emu::launch(emu::LaunchConfig(1, 32, 0, nullptr), [&] { buf.get()[buf.size()] = 1; }); }),
        "a kernel writing past its buffer did not fault", 0, 0, 0);
}

}  // namespace

int main() {
  return run_launcher_test([] {
    std::mt19937 rng(2026);
    emulation_rules();
    emu::host = {};

    for (const DType t : {DType::F32, DType::BF16, DType::F16, DType::F64}) {
      const i64 v = 16 / static_cast<i64>(dtype_size(t));
      const std::size_t e = dtype_size(t);
      // Packs a thread 1, 2, 4 and 8 (128..512 threads), an odd width, an
      // unaligned x: the fast kernel's instances, then the general kernel.
      for (const i64 packs : {100, 250, 1000, 1500}) forward(t, 3, packs * v, 0, rng);
      forward(t, 3, 100 * v + 1, 0, rng);
      forward(t, 2, 100 * v, e, rng);
      if (t == DType::F64) continue;
      bda_forward(t, 3, 64 * v, true, 0, rng);
      bda_forward(t, 3, 64 * v, false, 0, rng);  // a layout of half rows: two calls
      bda_forward(t, 3, 64 * v, true, e, rng);   // unaligned: two calls
      dropouts(t, 5, 40 * v, Layout::Hidden, 0, rng);
      dropouts(t, 5, 40 * v, Layout::HalfRows, 0, rng);
      dropouts(t, 5, 40 * v + 1, Layout::Hidden, 0, rng);    // odd rows: element by element
      dropouts(t, 5, 40 * v + 2, Layout::HalfRows, 0, rng);  // odd layout rows
      dropouts(t, 6, 40 * v + 2, Layout::Paired, 0, rng);    // layout rows of 4k elements, rows of 4k + 2
      dropouts(t, 5, 40 * v, Layout::Hidden, e, rng);        // unaligned
    }
    for (const DType t : {DType::F32, DType::BF16, DType::F16}) {
      const i64 v = 16 / static_cast<i64>(dtype_size(t));
      const std::size_t e = dtype_size(t);
      // One pack a thread (several lanes a block) and two (one lane, 288
      // threads); rows that leave lanes idle.
      for (const i64 cols : {48 * v, 520 * v})
        for (const DType acc : {DType::F32, t}) {
          if (acc == t && t == DType::F32) continue;
          for (const Passes passes : {Passes::Auto, Passes::Split, Passes::OnePass, Passes::OnePassPrefetched})
            backward({t, 7, cols, acc, true, 0}, passes, rng);
          backward({t, 5, cols, acc, false, 0}, Passes::Auto, rng);
          for (const bool with_bias : {true, false})
            for (const bool prefetch : {false, true})
              backward_dropout({t, 7, cols, acc, true, 0}, with_bias, prefetch, true, rng);
        }
      backward({t, 4, 48 * v, DType::F32, true, e}, Passes::Auto, rng);  // unaligned dy: split
      backward({t, 4, 48 * v, DType::F32, false, 0}, Passes::Auto, rng);
      backward_dropout({t, 4, 48 * v, DType::F32, true, e}, true, false, true, rng);   // unaligned
      backward_dropout({t, 4, 48 * v, DType::F32, true, 0}, true, false, false, rng);  // half-row layout
      backward_dropout({t, 4, 48 * v, DType::F32, false, 0}, false, true, false, rng);
    }
    backward({DType::F64, 3, 70, DType::F64, true, 0}, Passes::Auto, rng);
  });
}
