// The CUDA flash attention against the fp32 CPU reference (engine/core/cpu/ops_cpu.h), on random bf16 inputs:
// ‖gpu − ref‖ / ‖ref‖ < 1e-2 for out, dq, dk and dv (bf16 operands land between 1e-3 and 1e-2), for both
// backward variants (deterministic and fast), lse within 2e-3 of log Σ exp, no NaN anywhere (outputs and
// scratch are poisoned with 0xFF bytes, a NaN in bf16 and fp32, before every run, so an unwritten element
// fails), a deterministic backward that is bit-identical run to run, and a fast backward whose dk and dv are
// (only dq goes through atomics).
// Needs a GPU: every test but the precondition check skips when none is visible.
#include "engine/core/cuda/attention.cuh"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "engine/core/cpu/ops_cpu.h"
#include "engine/core/cpu/thread_pool.h"
#include "engine/core/fatal.h"  // FatalError
#include "engine/core/rng.h"

namespace gantry {
namespace {

constexpr double kTolerance = 1e-2;
constexpr double kLseTolerance = 2e-3;

#define ASSERT_CUDA(call) ASSERT_EQ(cudaSuccess, (call)) << #call

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define SKIP_WITHOUT_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible (cudaGetDeviceCount gave 0 or failed)"

// Round to nearest even; inputs here are finite.
uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// n normal values rounded to bf16: `bits` for the GPU, `values` (the same numbers) for the CPU reference.
void random_bf16(Rng& rng, size_t n, std::vector<uint16_t>& bits, std::vector<float>& values) {
  bits.resize(n);
  values.resize(n);
  for (size_t i = 0; i < n; ++i) {
    bits[i] = to_bf16(static_cast<float>(rng.normal()));
    values[i] = from_bf16(bits[i]);
  }
}

// A device buffer of n elements of T, freed on scope exit.
template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t count) : n(count) {
    if (cudaMalloc(&ptr, n * sizeof(T)) != cudaSuccess) ptr = nullptr;
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  size_t bytes() const { return n * sizeof(T); }
  cudaError_t poison() const { return cudaMemset(ptr, 0xFF, bytes()); }
};

struct Shape {
  int B, T, NH, HS;
};

std::string name(const Shape& s) {
  return "B" + std::to_string(s.B) + "_T" + std::to_string(s.T) + "_NH" + std::to_string(s.NH) + "_HS" +
         std::to_string(s.HS);
}

// ‖a − ref‖ / ‖ref‖ over the columns [col, col + width) of rows of `stride` floats; nan_count counts
// non-finite a.
double rel_error(const std::vector<float>& a, const std::vector<float>& ref, size_t rows, size_t stride,
                 size_t col, size_t width, size_t* nan_count) {
  double num = 0, den = 0;
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = col; c < col + width; ++c) {
      const double x = a[r * stride + c], y = ref[r * stride + c];
      if (!std::isfinite(x)) ++*nan_count;
      num += (x - y) * (x - y);
      den += y * y;
    }
  return std::sqrt(num / den);
}

std::vector<float> bf16_to_float(const std::vector<uint16_t>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = from_bf16(v[i]);
  return f;
}

class AttentionCuda : public ::testing::TestWithParam<Shape> {};

TEST_P(AttentionCuda, MatchesCpuReference) {
  SKIP_WITHOUT_GPU();
  const Shape s = GetParam();
  const int B = s.B, T = s.T, NH = s.NH, HS = s.HS, C = NH * HS;
  const size_t n_qkv = static_cast<size_t>(B) * T * 3 * C, n_out = static_cast<size_t>(B) * T * C;
  const size_t n_lse = static_cast<size_t>(B) * NH * T;

  Rng rng{0x5EED0000ull + static_cast<uint64_t>(B * 1000003 + T * 1009 + NH * 31 + HS)};
  std::vector<uint16_t> qkv_bits, dout_bits;
  std::vector<float> qkv, dout;
  random_bf16(rng, n_qkv, qkv_bits, qkv);
  random_bf16(rng, n_out, dout_bits, dout);

  // CPU reference, fp32 on the same bf16-rounded values.
  ThreadPool pool(0);
  std::vector<float> ref_out(n_out), att(static_cast<size_t>(B) * NH * T * T), ref_dqkv(n_qkv, 0.f);
  attention_forward(&pool, ref_out.data(), att.data(), qkv.data(), B, T, C, NH);

  // GPU forward.
  DeviceBuffer<__nv_bfloat16> d_qkv(n_qkv), d_out(n_out), d_dout(n_out), d_dqkv(n_qkv);
  DeviceBuffer<float> d_lse(n_lse), d_scratch(attention_backward_scratch_floats(B, T, NH, HS));
  ASSERT_TRUE(d_qkv.ptr && d_out.ptr && d_dout.ptr && d_dqkv.ptr && d_lse.ptr && d_scratch.ptr);
  ASSERT_CUDA(cudaMemcpy(d_qkv.ptr, qkv_bits.data(), d_qkv.bytes(), cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemcpy(d_dout.ptr, dout_bits.data(), d_dout.bytes(), cudaMemcpyHostToDevice));
  ASSERT_CUDA(d_out.poison());
  ASSERT_CUDA(d_lse.poison());
  attention_forward(d_out.ptr, d_lse.ptr, d_qkv.ptr, B, T, NH, HS, nullptr);
  ASSERT_CUDA(cudaDeviceSynchronize());
  std::vector<uint16_t> out_bits(n_out);
  std::vector<float> lse(n_lse);
  ASSERT_CUDA(cudaMemcpy(out_bits.data(), d_out.ptr, d_out.bytes(), cudaMemcpyDeviceToHost));
  ASSERT_CUDA(cudaMemcpy(lse.data(), d_lse.ptr, d_lse.bytes(), cudaMemcpyDeviceToHost));
  const std::vector<float> out = bf16_to_float(out_bits);

  size_t nans = 0;
  const double err_out = rel_error(out, ref_out, static_cast<size_t>(B) * T, C, 0, C, &nans);
  EXPECT_EQ(nans, 0u) << "non-finite values in out";
  EXPECT_LT(err_out, kTolerance) << "out";

  // lse = scale·q·k_j − log p_j for any visible key j; take the most probable one.
  const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
  double lse_err = 0;
  size_t lse_nans = 0;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const float* a = &att[((static_cast<size_t>(b) * NH + h) * T + t) * T];
        int jmax = 0;
        for (int j = 1; j <= t; ++j)
          if (a[j] > a[jmax]) jmax = j;
        const float* q = &qkv[(static_cast<size_t>(b) * T + t) * 3 * C + h * HS];
        const float* k = &qkv[(static_cast<size_t>(b) * T + jmax) * 3 * C + C + h * HS];
        double dot = 0;
        for (int i = 0; i < HS; ++i) dot += static_cast<double>(q[i]) * k[i];
        const double ref = scale * dot - std::log(static_cast<double>(a[jmax]));
        const float got = lse[(static_cast<size_t>(b) * NH + h) * T + t];
        if (!std::isfinite(got)) ++lse_nans;
        lse_err = std::max(lse_err, std::abs(got - ref));
      }
  EXPECT_EQ(lse_nans, 0u) << "non-finite values in lse";
  EXPECT_LT(lse_err, kLseTolerance) << "lse, max abs error";

  // Backward: the CPU reference uses its own fp32 out (through att); the GPU uses its bf16 out.
  attention_backward(&pool, ref_dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
  for (const bool deterministic : {true, false}) {
    const char* variant = deterministic ? "deterministic" : "fast";
    SCOPED_TRACE(variant);
    ASSERT_CUDA(d_dqkv.poison());
    ASSERT_CUDA(d_scratch.poison());
    attention_backward(d_dqkv.ptr, d_dout.ptr, d_out.ptr, d_lse.ptr, d_qkv.ptr, d_scratch.ptr, B, T, NH, HS,
                       nullptr, deterministic);
    ASSERT_CUDA(cudaDeviceSynchronize());
    std::vector<uint16_t> dqkv_bits(n_qkv);
    ASSERT_CUDA(cudaMemcpy(dqkv_bits.data(), d_dqkv.ptr, d_dqkv.bytes(), cudaMemcpyDeviceToHost));
    const std::vector<float> dqkv = bf16_to_float(dqkv_bits);

    const char* names[3] = {"dq", "dk", "dv"};
    for (int part = 0; part < 3; ++part) {
      size_t part_nans = 0;
      const double err = rel_error(dqkv, ref_dqkv, static_cast<size_t>(B) * T, 3 * static_cast<size_t>(C),
                                   part * C, C, &part_nans);
      EXPECT_EQ(part_nans, 0u) << "non-finite values in " << names[part];
      EXPECT_LT(err, kTolerance) << names[part];
      std::printf("[ %s ] %s %s rel err %.2e\n", name(s).c_str(), variant, names[part], err);
    }
  }
  std::printf("[ %s ] out rel err %.2e, lse max abs err %.2e\n", name(s).c_str(), err_out, lse_err);
}

// Ragged T (100, 300, 77) for every head size; B4_T768_NH12_HS64 has more heads than one backward block group
// (engine/core/cuda/attention.cu, block_head_tile) on an H100/H200, so a full and a partial group both run.
INSTANTIATE_TEST_SUITE_P(Shapes, AttentionCuda,
                         ::testing::Values(Shape{2, 64, 4, 16}, Shape{1, 100, 2, 32}, Shape{2, 256, 4, 64},
                                           Shape{1, 1024, 12, 64}, Shape{1, 300, 3, 64},
                                           Shape{4, 768, 12, 64}, Shape{1, 77, 2, 128}),
                         [](const ::testing::TestParamInfo<Shape>& p) { return name(p.param); });

// Two backward runs (and two forward runs) on the same inputs give the same bytes; for the fast backward,
// dk and dv give the same bytes and dq stays within rounding of the first run.
TEST(AttentionCudaDeterminism, BitIdenticalRunToRun) {
  SKIP_WITHOUT_GPU();
  // B4_T1024_NH12_HS64: more CTAs than fit the device at once (several groups of heads, several waves).
  for (const Shape s :
       {Shape{2, 256, 4, 64}, Shape{4, 1024, 12, 64}, Shape{1, 100, 2, 32}, Shape{1, 77, 2, 128}}) {
    SCOPED_TRACE(name(s));
    const int B = s.B, T = s.T, NH = s.NH, HS = s.HS, C = NH * HS;
    const size_t n_qkv = static_cast<size_t>(B) * T * 3 * C, n_out = static_cast<size_t>(B) * T * C;
    Rng rng{0xD37E0000ull + static_cast<uint64_t>(T * 7 + HS)};
    std::vector<uint16_t> qkv_bits, dout_bits;
    std::vector<float> unused;
    random_bf16(rng, n_qkv, qkv_bits, unused);
    random_bf16(rng, n_out, dout_bits, unused);

    DeviceBuffer<__nv_bfloat16> d_qkv(n_qkv), d_out(n_out), d_dout(n_out), d_dqkv(n_qkv);
    DeviceBuffer<float> d_lse(static_cast<size_t>(B) * NH * T),
        d_scratch(attention_backward_scratch_floats(B, T, NH, HS));
    ASSERT_TRUE(d_qkv.ptr && d_out.ptr && d_dout.ptr && d_dqkv.ptr && d_lse.ptr && d_scratch.ptr);
    ASSERT_CUDA(cudaMemcpy(d_qkv.ptr, qkv_bits.data(), d_qkv.bytes(), cudaMemcpyHostToDevice));
    ASSERT_CUDA(cudaMemcpy(d_dout.ptr, dout_bits.data(), d_dout.bytes(), cudaMemcpyHostToDevice));

    // One forward + backward from poisoned outputs; returns out and dqkv as raw bf16 bits.
    auto run_once = [&](std::vector<uint16_t>& out_bits, std::vector<uint16_t>& dqkv_bits,
                        bool deterministic) {
      out_bits.resize(n_out);
      dqkv_bits.resize(n_qkv);
      if (d_out.poison() != cudaSuccess || d_lse.poison() != cudaSuccess || d_dqkv.poison() != cudaSuccess ||
          d_scratch.poison() != cudaSuccess)
        return false;
      attention_forward(d_out.ptr, d_lse.ptr, d_qkv.ptr, B, T, NH, HS, nullptr);
      attention_backward(d_dqkv.ptr, d_dout.ptr, d_out.ptr, d_lse.ptr, d_qkv.ptr, d_scratch.ptr, B, T, NH, HS,
                         nullptr, deterministic);
      return cudaMemcpy(out_bits.data(), d_out.ptr, d_out.bytes(), cudaMemcpyDeviceToHost) == cudaSuccess &&
             cudaMemcpy(dqkv_bits.data(), d_dqkv.ptr, d_dqkv.bytes(), cudaMemcpyDeviceToHost) == cudaSuccess;
    };
    std::vector<uint16_t> first_out, second_out, first, second;
    ASSERT_TRUE(run_once(first_out, first, true));
    ASSERT_TRUE(run_once(second_out, second, true));
    EXPECT_EQ(0, std::memcmp(first_out.data(), second_out.data(), d_out.bytes())) << "forward differs";
    EXPECT_EQ(0, std::memcmp(first.data(), second.data(), d_dqkv.bytes())) << "backward differs";
    size_t nans = 0;
    for (uint16_t x : first) nans += !std::isfinite(from_bf16(x));
    EXPECT_EQ(nans, 0u);

    // Fast variant, twice: dk and dv bit-identical; dq close.
    std::vector<uint16_t> fast_a, fast_b;
    ASSERT_TRUE(run_once(first_out, fast_a, false));
    ASSERT_TRUE(run_once(second_out, fast_b, false));
    const std::vector<float> fa = bf16_to_float(fast_a), fb = bf16_to_float(fast_b);
    const size_t rows = static_cast<size_t>(B) * T, stride = 3 * static_cast<size_t>(C);
    size_t fast_nans = 0;
    EXPECT_LT(rel_error(fb, fa, rows, stride, 0, C, &fast_nans), 1e-3) << "fast dq, run to run";
    EXPECT_EQ(0.0, rel_error(fb, fa, rows, stride, C, 2 * static_cast<size_t>(C), &fast_nans))
        << "fast dk/dv, run to run";
    EXPECT_EQ(fast_nans, 0u);
  }
}

// attention_forward takes the wgmma kernel on a Hopper GPU at HS 64 with T % 64 == 0 (the shapes above with
// HS 64 check it against the CPU reference; T 300 takes mma.sync): it gives the mma.sync kernel's function,
// out within 1e-3 normalised (the two round P to bf16 in different orders of the same sums; ~3e-5 measured)
// and lse within 1e-4, and writes every element (outputs poisoned first). Elsewhere both are one kernel.
TEST(AttentionCudaForwardPaths, WgmmaAndMmaSyncGiveTheSameFunction) {
  SKIP_WITHOUT_GPU();
  for (const Shape s : {Shape{2, 256, 4, 64}, Shape{1, 1024, 12, 64}, Shape{3, 128, 2, 64}}) {
    SCOPED_TRACE(name(s));
    const int B = s.B, T = s.T, NH = s.NH, HS = s.HS, C = NH * HS;
    const size_t n_qkv = static_cast<size_t>(B) * T * 3 * C, n_out = static_cast<size_t>(B) * T * C,
                 n_lse = static_cast<size_t>(B) * NH * T;
    Rng rng{0xF0A30000ull + static_cast<uint64_t>(T * 13 + NH)};
    std::vector<uint16_t> qkv_bits;
    std::vector<float> unused;
    random_bf16(rng, n_qkv, qkv_bits, unused);
    DeviceBuffer<__nv_bfloat16> d_qkv(n_qkv), d_out(n_out), d_ref(n_out);
    DeviceBuffer<float> d_lse(n_lse), d_lse_ref(n_lse);
    ASSERT_TRUE(d_qkv.ptr && d_out.ptr && d_ref.ptr && d_lse.ptr && d_lse_ref.ptr);
    ASSERT_CUDA(cudaMemcpy(d_qkv.ptr, qkv_bits.data(), d_qkv.bytes(), cudaMemcpyHostToDevice));
    ASSERT_CUDA(d_out.poison());
    ASSERT_CUDA(d_lse.poison());
    attention_forward_mma(d_ref.ptr, d_lse_ref.ptr, d_qkv.ptr, B, T, NH, HS, nullptr);
    attention_forward(d_out.ptr, d_lse.ptr, d_qkv.ptr, B, T, NH, HS, nullptr);
    ASSERT_CUDA(cudaDeviceSynchronize());
    std::vector<uint16_t> out_bits(n_out), ref_bits(n_out);
    std::vector<float> lse(n_lse), lse_ref(n_lse);
    ASSERT_CUDA(cudaMemcpy(out_bits.data(), d_out.ptr, d_out.bytes(), cudaMemcpyDeviceToHost));
    ASSERT_CUDA(cudaMemcpy(ref_bits.data(), d_ref.ptr, d_ref.bytes(), cudaMemcpyDeviceToHost));
    ASSERT_CUDA(cudaMemcpy(lse.data(), d_lse.ptr, d_lse.bytes(), cudaMemcpyDeviceToHost));
    ASSERT_CUDA(cudaMemcpy(lse_ref.data(), d_lse_ref.ptr, d_lse_ref.bytes(), cudaMemcpyDeviceToHost));
    size_t nans = 0;
    EXPECT_LT(rel_error(bf16_to_float(out_bits), bf16_to_float(ref_bits), static_cast<size_t>(B) * T, C, 0, C,
                        &nans),
              1e-3);
    EXPECT_EQ(nans, 0u);
    double lse_diff = 0;
    for (size_t i = 0; i < n_lse; ++i) {
      ASSERT_TRUE(std::isfinite(lse[i])) << "lse " << i;
      lse_diff = std::max(lse_diff, static_cast<double>(std::fabs(lse[i] - lse_ref[i])));
    }
    EXPECT_LT(lse_diff, 1e-4);
  }
}

// The deterministic attention_backward takes the wgmma kernels on a Hopper GPU at HS 64 with T % 64 == 0 (the
// HS-64 shapes above with T % 64 == 0 check them against the CPU reference, and the determinism test's
// B2_T256_NH4_HS64 their repeatability): they give the mma.sync kernels' function, dq, dk and dv each within
// 5e-3 normalised of attention_backward_mma's (the wgmma dK/dV kernel takes P for dS from its bf16 copy),
// and write every element (outputs poisoned first). Elsewhere both are one kernel.
TEST(AttentionCudaBackwardPaths, WgmmaAndMmaSyncGiveTheSameFunction) {
  SKIP_WITHOUT_GPU();
  for (const Shape s : {Shape{2, 256, 4, 64}, Shape{1, 1024, 12, 64}, Shape{3, 128, 2, 64}}) {
    SCOPED_TRACE(name(s));
    const int B = s.B, T = s.T, NH = s.NH, HS = s.HS, C = NH * HS;
    const size_t n_qkv = static_cast<size_t>(B) * T * 3 * C, n_out = static_cast<size_t>(B) * T * C,
                 n_lse = static_cast<size_t>(B) * NH * T;
    Rng rng{0xB0A30000ull + static_cast<uint64_t>(T * 13 + NH)};
    std::vector<uint16_t> qkv_bits, dout_bits;
    std::vector<float> unused;
    random_bf16(rng, n_qkv, qkv_bits, unused);
    random_bf16(rng, n_out, dout_bits, unused);
    DeviceBuffer<__nv_bfloat16> d_qkv(n_qkv), d_out(n_out), d_dout(n_out), d_dqkv(n_qkv), d_ref(n_qkv);
    DeviceBuffer<float> d_lse(n_lse), d_scratch(attention_backward_scratch_floats(B, T, NH, HS));
    ASSERT_TRUE(d_qkv.ptr && d_out.ptr && d_dout.ptr && d_dqkv.ptr && d_ref.ptr && d_lse.ptr &&
                d_scratch.ptr);
    ASSERT_CUDA(cudaMemcpy(d_qkv.ptr, qkv_bits.data(), d_qkv.bytes(), cudaMemcpyHostToDevice));
    ASSERT_CUDA(cudaMemcpy(d_dout.ptr, dout_bits.data(), d_dout.bytes(), cudaMemcpyHostToDevice));
    attention_forward(d_out.ptr, d_lse.ptr, d_qkv.ptr, B, T, NH, HS, nullptr);
    ASSERT_CUDA(d_ref.poison());
    ASSERT_CUDA(d_scratch.poison());
    attention_backward_mma(d_ref.ptr, d_dout.ptr, d_out.ptr, d_lse.ptr, d_qkv.ptr, d_scratch.ptr, B, T, NH,
                           HS, nullptr);
    ASSERT_CUDA(d_dqkv.poison());
    ASSERT_CUDA(d_scratch.poison());
    attention_backward(d_dqkv.ptr, d_dout.ptr, d_out.ptr, d_lse.ptr, d_qkv.ptr, d_scratch.ptr, B, T, NH, HS,
                       nullptr);
    ASSERT_CUDA(cudaDeviceSynchronize());
    std::vector<uint16_t> got_bits(n_qkv), ref_bits(n_qkv);
    ASSERT_CUDA(cudaMemcpy(got_bits.data(), d_dqkv.ptr, d_dqkv.bytes(), cudaMemcpyDeviceToHost));
    ASSERT_CUDA(cudaMemcpy(ref_bits.data(), d_ref.ptr, d_ref.bytes(), cudaMemcpyDeviceToHost));
    const std::vector<float> got = bf16_to_float(got_bits), ref = bf16_to_float(ref_bits);
    const char* names[3] = {"dq", "dk", "dv"};
    for (int part = 0; part < 3; ++part) {
      size_t nans = 0;
      const double diff = rel_error(got, ref, static_cast<size_t>(B) * T, 3 * static_cast<size_t>(C),
                                    part * static_cast<size_t>(C), C, &nans);
      EXPECT_EQ(nans, 0u) << names[part];
      EXPECT_LT(diff, 5e-3) << names[part];
      std::printf("[ %s ] wgmma vs mma.sync %s normalised difference %.2e\n", name(s).c_str(), names[part],
                  diff);
    }
  }
}

// The scratch size covers both variants and, with the default head size, every head size.
TEST(AttentionCudaScratch, CoversEveryHeadSize) {
  const size_t det = static_cast<size_t>(4) * 1000 * 6;
  for (int hs : {16, 32, 64, 128}) {
    EXPECT_GT(attention_backward_scratch_floats(4, 1000, 6, hs),
              det + static_cast<size_t>(4) * 1000 * 6 * hs);
    EXPECT_GE(attention_backward_scratch_floats(4, 1000, 6),
              attention_backward_scratch_floats(4, 1000, 6, hs));
  }
  EXPECT_THROW(attention_backward_scratch_floats(0, 16, 1), FatalError);
}

// Preconditions are checked on the host before anything touches the device, so this needs no GPU.
TEST(AttentionCudaPreconditions, RejectsUnsupportedHeadSizeAndNull) {
  alignas(16) static uint16_t dummy[64];
  auto* p = reinterpret_cast<__nv_bfloat16*>(dummy);
  float* f = reinterpret_cast<float*>(dummy);
  EXPECT_THROW(attention_forward(p, f, p, 1, 16, 1, 48, nullptr), FatalError);
  EXPECT_THROW(attention_forward(nullptr, f, p, 1, 16, 1, 64, nullptr), FatalError);
  EXPECT_THROW(attention_forward(p, f, p, 1, 0, 1, 64, nullptr), FatalError);
  EXPECT_THROW(attention_backward(p, p, p, f, p, nullptr, 1, 16, 1, 64, nullptr), FatalError);
  EXPECT_THROW(attention_backward(p, p, p, f, p, f, 1, 16, 1, 80, nullptr), FatalError);
  EXPECT_THROW(attention_backward(p, p, p, f, p, f, 1, 16, 1, 80, nullptr, false), FatalError);
  EXPECT_THROW(attention_backward(p, p, p, f, p, f + 1, 1, 16, 1, 64, nullptr, false),
               FatalError);  // aligned
}

}  // namespace
}  // namespace gantry
