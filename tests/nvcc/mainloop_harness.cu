// Standalone check and benchmark of the tiled-variant GEMM mainloops (templates/mainloop/).
//
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Itemplates \
//        tests/nvcc/mainloop_harness.cu -lcublas -o /tmp/h && /tmp/h
//
// Each case instantiates a Spec, runs `mainloop -> AccTile -> copy to global` and compares with a
// float64 CPU reference by ||out - ref|| / ||ref|| (every element for small problems, a random
// sample plus a NaN scan for large ones). Outputs are poisoned with NaN first, the matrices'
// padding columns and the memory past their ends hold NaN (so any read past K shows up), and the
// column padding of C must still be NaN afterwards (so any write past N shows up). Timed cases
// write the output in the storage type, like cuBLAS, and are compared with cublasGemmEx on the
// same shape (median of 20 after warmup). Option: --quick skips the timed cases.
//
// Compiled with -c by tests/cpu/template_nvcc_test.cpp (no GPU needed) to prove the templates are
// valid CUDA C++ for sm_80 and sm_90a.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "common/math_kind.cuh"
#include "common/params.h"
#include "common/tile.cuh"
#include "common/types.cuh"
#include "mainloop/operands.cuh"
#include "mainloop/simt_fp32.cuh"
#include "mainloop/tiled_mma.cuh"

#define CK(call)                                                                                  \
  do {                                                                                            \
    cudaError_t e_ = (call);                                                                      \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(2);                                                                               \
    }                                                                                             \
  } while (0)
#define CKB(call)                                                                                \
  do {                                                                                           \
    cublasStatus_t s_ = (call);                                                                  \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                           \
      std::fprintf(stderr, "%s:%d: %s: cublas status %d\n", __FILE__, __LINE__, #call, int(s_)); \
      std::exit(2);                                                                              \
    }                                                                                            \
  } while (0)

namespace {

// ---- Specs -------------------------------------------------------------------------------

template <class T_, int MATH_, int M_, int N_, int K_, int LDX_, int LDW_, int VEC_, int BM_,
          int BN_, int BK_, int WM_, int WN_, int S_, bool ROUND_ = true>
struct HSpec {
  using T = T_;
  using P = float;
  static constexpr int MATH = MATH_;
  static constexpr int M = M_, N = N_, K = K_, LDX = LDX_, LDW = LDW_, LDY = N_;
  static constexpr int BM = BM_, BN = BN_, BK = BK_, WARPS_M = WM_, WARPS_N = WN_, STAGES = S_;
  static constexpr int THREADS = WM_ * WN_ * 32;
  static constexpr int VEC_BYTES = VEC_, A_VEC_BYTES = VEC_, B_VEC_BYTES = VEC_;
  static constexpr int GROUP_M = 8;
  static constexpr bool TF32_ROUND = ROUND_;
  static_assert(LDY == N, "the harness writes y densely");
};

template <class Spec>
using MainloopOf = std::conditional_t<Spec::MATH == fj::kMathSimtFp32,
                                      fj::SimtFp32Mainloop<fj::LinearOperands<Spec>>,
                                      fj::TiledMmaMainloop<fj::LinearOperands<Spec>>>;

template <class Spec>
constexpr int harness_smem() {
  constexpr int a = MainloopOf<Spec>::kSmemBytes;
  constexpr int b = fj::AccTile<Spec::BM, Spec::BN>::kBytes;
  return a > b ? a : b;
}

// ---- Kernel ------------------------------------------------------------------------------

__device__ __forceinline__ void store4(float* p, float4 v, bool vec) {
  if (vec) {
    *reinterpret_cast<float4*>(p) = v;
  } else {
    p[0] = v.x, p[1] = v.y, p[2] = v.z, p[3] = v.w;
  }
}
template <class T>
__device__ __forceinline__ void store4(T* p, float4 v, bool vec) {
  if (vec) {
    uint2 u;
    u.x = fj::pack2<T>(v.x, v.y);
    u.y = fj::pack2<T>(v.z, v.w);
    *reinterpret_cast<uint2*>(p) = u;
  } else {
    p[0] = fj::from_float<T>(v.x), p[1] = fj::from_float<T>(v.y);
    p[2] = fj::from_float<T>(v.z), p[3] = fj::from_float<T>(v.w);
  }
}
__device__ __forceinline__ void store1(float* p, float v) {
  *p = v;
}
template <class T>
__device__ __forceinline__ void store1(T* p, float v) {
  *p = fj::from_float<T>(v);
}

template <class Spec, class OutT>
__global__ void __launch_bounds__(Spec::THREADS) gemm_kernel(const fj::Params p, OutT* C, int ldc) {
  extern __shared__ __align__(128) char smem[];
  constexpr int BM = Spec::BM, BN = Spec::BN;
  constexpr int kRows = (Spec::M + BM - 1) / BM, kCols = (Spec::N + BN - 1) / BN;
  // Grouped raster: GROUP_M row tiles per column sweep, for L2 reuse of W and x tiles.
  constexpr int kPerGroup = Spec::GROUP_M * kCols;
  const int linear = blockIdx.x;
  const int first = (linear / kPerGroup) * Spec::GROUP_M;
  const int in_group = min(kRows - first, Spec::GROUP_M);
  const int tm = first + (linear % kPerGroup) % in_group;
  const int tn = (linear % kPerGroup) / in_group;
  const int m0 = tm * BM, n0 = tn * BN;

  const fj::AccTile<BM, BN> tile{reinterpret_cast<float*>(smem)};
  MainloopOf<Spec>::run(fj::GemmOperands{p.x, p.w, Spec::M, Spec::K}, smem, m0, n0,
                        fj::KRange{0, MainloopOf<Spec>::KT}, tile);

  static_assert(BN % 4 == 0, "harness copies 4 columns at a time");
  const bool vec_ok = ldc % 4 == 0;
  for (int i = threadIdx.x; i < BM * BN / 4; i += Spec::THREADS) {
    const int r = i / (BN / 4), c = (i % (BN / 4)) * 4;
    const int gm = m0 + r, gn = n0 + c;
    if (gm >= Spec::M || gn >= Spec::N) continue;
    const float4 v = *reinterpret_cast<const float4*>(&tile(r, c));
    OutT* dst = C + static_cast<long long>(gm) * ldc + gn;
    if (gn + 3 < Spec::N) {
      store4(dst, v, vec_ok);
    } else {
      store1(dst, v.x);  // gn < N here
      if (gn + 1 < Spec::N) store1(dst + 1, v.y);
      if (gn + 2 < Spec::N) store1(dst + 2, v.z);
    }
  }
}

// Register-only mma.sync loop: 32 independent 16x8 tiles per warp per iteration, no memory
// traffic. Its rate is the ceiling any mma.sync mainloop can reach on this GPU.
template <int MATH>
__global__ void __launch_bounds__(128) mma_peak_kernel(float* out, int iters) {
  unsigned a[4][4], b[8][2];
  float acc[4][8][4];
  // 1.0 in bf16/fp16 pairs, or a small fp32: finite sums however long the loop.
  const unsigned one = MATH == fj::kMathBf16   ? 0x3f803f80u
                       : MATH == fj::kMathFp16 ? 0x3c003c00u
                                               : 0x3f800000u;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) a[i][j] = one ^ (threadIdx.x & 1);
  for (int i = 0; i < 8; ++i) b[i][0] = b[i][1] = one;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 8; ++j)
      for (int k = 0; k < 4; ++k) acc[i][j][k] = 0.f;
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) fj::mma_16x8<MATH>(acc[mt][nt], a[mt], b[nt]);
  }
  float s = 0.f;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 8; ++j)
      for (int k = 0; k < 4; ++k) s += acc[i][j][k];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

template <class Spec, class OutT>
void launch(const fj::Params& p, OutT* C, int ldc, cudaStream_t s) {
  constexpr int smem = harness_smem<Spec>();
  static bool configured = false;
  if (!configured) {
    CK(cudaFuncSetAttribute(gemm_kernel<Spec, OutT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            smem));
    configured = true;
  }
  constexpr int grid =
      ((Spec::M + Spec::BM - 1) / Spec::BM) * ((Spec::N + Spec::BN - 1) / Spec::BN);
  gemm_kernel<Spec, OutT><<<grid, Spec::THREADS, smem, s>>>(p, C, ldc);
  CK(cudaGetLastError());
}

// ---- Host helpers ------------------------------------------------------------------------

uint16_t bf16_bits(float f) {  // exact for the values we generate (<= 8 significant bits)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}
uint16_t half_bits(float f) {  // exact for the values we generate (normal, <= 11 bits)
  if (f == 0.f) return 0;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const int exp = int((u >> 23) & 0xff) - 127 + 15;
  const uint32_t mant = (u >> 13) & 0x3ffu;
  return static_cast<uint16_t>(sign | (uint32_t(exp) << 10) | mant);
}

const char* math_name(int m) {
  switch (m) {
    case fj::kMathSimtFp32:
      return "fp32";
    case fj::kMathTf32:
      return "tf32";
    case fj::kMathFp16:
      return "fp16";
    default:
      return "bf16";
  }
}

struct Result {
  std::string name;
  int M, N, K;
  double err, tol;
  long long nan_count;
  bool pass;
  double tflops = 0, cublas_tflops = 0;
};
std::vector<Result> g_results;
cublasHandle_t g_cublas;
std::mt19937_64 g_rng(12345);

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class F>
double time_ms(F&& f, cudaStream_t s) {
  for (int i = 0; i < 3; ++i) f();
  CK(cudaStreamSynchronize(s));
  std::vector<float> ms;
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 20; ++i) {
    CK(cudaEventRecord(a, s));
    f();
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float t;
    CK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return median(ms);
}

template <int MATH>
double mma_peak_tflops(int sms) {
  const int grid = sms * 8, iters = 4096;
  float* out;
  CK(cudaMalloc(&out, size_t(grid) * 128 * sizeof(float)));
  const double ms = time_ms([&] { mma_peak_kernel<MATH><<<grid, 128>>>(out, iters); }, nullptr);
  CK(cudaGetLastError());
  CK(cudaFree(out));
  const double k = MATH == fj::kMathTf32 ? 8 : 16;
  return 2.0 * 16 * 8 * k * 32 * iters * (grid * 4.0) / ms * 1e-9;
}

// A [rows][ld] matrix of exact-in-dtype random values (never zero), with NaN in its padding
// columns and in 64 elements past its end, at a base address aligned to exactly `vec` bytes.
template <class T>
struct DevMatrix {
  std::vector<double> host;  // rows x cols values as the device sees them
  char* alloc = nullptr;
  T* dev = nullptr;
  DevMatrix(int rows, int cols, int ld, int vec, int math) : host(size_t(rows) * cols) {
    std::uniform_int_distribution<int> q16(-128, 128), q11(-1024, 1024);
    std::uniform_real_distribution<float> uf(-1.f, 1.f);
    const size_t elems = size_t(rows - 1) * ld + cols + 64;
    std::vector<T> h(elems);
    for (auto& e : h) std::memset(&e, 0xff, sizeof(T));  // NaN in every storage type
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) {
        float v;
        if (math == fj::kMathBf16) {
          int i = q16(g_rng);
          v = float(i ? i : 1) / 128.f;
        } else if (math == fj::kMathFp16) {
          int i = q11(g_rng);
          v = float(i ? i : 1) / 1024.f;
        } else {
          v = uf(g_rng);
          if (v == 0.f) v = 0.5f;
        }
        host[size_t(r) * cols + c] = v;
        T& dst = h[size_t(r) * ld + c];
        if constexpr (std::is_same_v<T, float>) {
          dst = v;
        } else if constexpr (std::is_same_v<T, fj::bf16_t>) {
          dst.bits = bf16_bits(v);
        } else {
          dst.bits = half_bits(v);
        }
      }
    // Offset the base by `vec` bytes from a 256-aligned allocation: aligned to vec, not 2*vec.
    const int off = vec < 16 ? vec : 0;
    CK(cudaMalloc(&alloc, elems * sizeof(T) + 256));
    dev = reinterpret_cast<T*>(alloc + off);
    CK(cudaMemcpy(dev, h.data(), elems * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DevMatrix() { cudaFree(alloc); }
};

cudaDataType_t cuda_type(int math) {
  switch (math) {
    case fj::kMathBf16:
      return CUDA_R_16BF;
    case fj::kMathFp16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

template <class Spec>
void run_case(const char* label, bool timed, bool quick) {
  using T = typename Spec::T;
  constexpr int M = Spec::M, N = Spec::N, K = Spec::K, MATH = Spec::MATH;
  if (timed && quick) return;
  char name[160];
  std::snprintf(name, sizeof name, "%s %s %dx%dx%d vec%d %dx%dx%d w%dx%d s%d%s", math_name(MATH),
                label, M, N, K, Spec::VEC_BYTES, Spec::BM, Spec::BN, Spec::BK, Spec::WARPS_M,
                Spec::WARPS_N, Spec::STAGES, Spec::TF32_ROUND ? "" : " trunc");
  DevMatrix<T> x(M, K, Spec::LDX, Spec::VEC_BYTES, MATH);
  DevMatrix<T> w(N, K, Spec::LDW, Spec::VEC_BYTES, MATH);
  const int ldc = N + 3;  // padding columns must stay NaN
  float* C;
  const size_t c_elems = size_t(M) * ldc;
  CK(cudaMalloc(&C, c_elems * sizeof(float)));
  CK(cudaMemset(C, 0xff, c_elems * sizeof(float)));
  fj::Params p{};
  p.x = x.dev;
  p.w = w.dev;
  launch<Spec>(p, C, ldc, nullptr);
  CK(cudaDeviceSynchronize());
  std::vector<float> out(c_elems);
  CK(cudaMemcpy(out.data(), C, c_elems * sizeof(float), cudaMemcpyDeviceToHost));
  CK(cudaFree(C));

  long long nan_count = 0;
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < ldc; ++c) {
      const bool is_nan = std::isnan(out[size_t(r) * ldc + c]);
      nan_count += c < N ? is_nan : !is_nan;  // written inside, untouched outside
    }
  auto ref = [&](int r, int c) {
    double s = 0;
    const double* a = &x.host[size_t(r) * K];
    const double* b = &w.host[size_t(c) * K];
    for (int k = 0; k < K; ++k) s += a[k] * b[k];
    return s;
  };
  double num = 0, den = 0;
  auto acc = [&](int r, int c) {
    const double d = ref(r, c), o = out[size_t(r) * ldc + c];
    num += (o - d) * (o - d);
    den += d * d;
  };
  if (double(M) * N * K <= double(1 << 28)) {
    for (int r = 0; r < M; ++r)
      for (int c = 0; c < N; ++c) acc(r, c);
  } else {
    std::uniform_int_distribution<int> rr(0, M - 1), cc(0, N - 1);
    acc(0, 0), acc(M - 1, N - 1), acc(0, N - 1), acc(M - 1, 0);
    for (int i = 0; i < 4096; ++i) acc(rr(g_rng), cc(g_rng));
  }
  const double err = std::sqrt(num / den);
  // Rounded tf32 lands near 2.6e-4 on these inputs and truncated tf32 near 7e-4: with enough
  // terms per dot product, the tighter bound checks that the rounding really happens.
  const double tf32_tol = Spec::TF32_ROUND && K >= 256 ? 4e-4 : 2e-3;
  const double tol = MATH == fj::kMathSimtFp32 ? 1e-5 : MATH == fj::kMathTf32 ? tf32_tol : 5e-3;
  Result res{name, M, N, K, err, tol, nan_count, nan_count == 0 && err < tol};
  std::printf("%-4s %-62s relerr %.3e (tol %.0e) bad %lld\n", res.pass ? "ok" : "FAIL", name, err,
              tol, nan_count);

  if (timed) {
    T* Y;
    CK(cudaMalloc(&Y, size_t(M) * N * sizeof(T)));
    const double flops = 2.0 * M * N * K;
    const double ms = time_ms([&] { launch<Spec>(p, Y, N, nullptr); }, nullptr);
    const float one = 1.f, zero = 0.f;
    // Default math mode: CUBLAS_COMPUTE_32F on fp32 data is a plain SGEMM (no tf32).
    const cublasComputeType_t ct =
        MATH == fj::kMathTf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    // Row-major y[M][N] = x[M][K] W[N][K]^T is column-major y^T = W^T(op T) x^T.
    const double cms = time_ms(
        [&] {
          CKB(cublasGemmEx(g_cublas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, w.dev,
                           cuda_type(MATH), Spec::LDW, x.dev, cuda_type(MATH), Spec::LDX, &zero, Y,
                           cuda_type(MATH), N, ct, CUBLAS_GEMM_DEFAULT));
        },
        nullptr);
    CK(cudaFree(Y));
    res.tflops = flops / ms * 1e-9;
    res.cublas_tflops = flops / cms * 1e-9;
    std::printf("     %-62s %8.1f TFLOP/s  cuBLAS %8.1f  ratio %.3f\n", name, res.tflops,
                res.cublas_tflops, res.tflops / res.cublas_tflops);
  }
  std::fflush(stdout);
  g_results.push_back(res);
}

using bf16 = fj::bf16_t;
using f16 = fj::half_t;
constexpr int BF = fj::kMathBf16, FH = fj::kMathFp16, TF = fj::kMathTf32, SF = fj::kMathSimtFp32;

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--quick")) quick = true;
  int dev = 0;
  CK(cudaSetDevice(dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  std::printf("device: %s, %d SMs, cc %d.%d\n", prop.name, prop.multiProcessorCount, prop.major,
              prop.minor);
  CKB(cublasCreate(&g_cublas));

  // --- correctness: tails, alignments, odd configs ----------------------------------------
  // T, MATH, M, N, K, LDX, LDW, VEC, BM, BN, BK, WARPS_M, WARPS_N, STAGES
  run_case<HSpec<bf16, BF, 129, 200, 1000, 1000, 1000, 16, 128, 128, 32, 2, 2, 4>>("tail", 0,
                                                                                   quick);
  run_case<HSpec<bf16, BF, 129, 200, 1000, 1000, 1000, 16, 128, 256, 32, 2, 4, 3>>("tail", 0,
                                                                                   quick);
  run_case<HSpec<bf16, BF, 129, 200, 1000, 1004, 1004, 8, 128, 128, 32, 2, 4, 4>>("tail", 0, quick);
  run_case<HSpec<f16, FH, 129, 200, 1000, 1002, 1002, 4, 128, 128, 32, 2, 4, 4>>("tail", 0, quick);
  run_case<HSpec<bf16, BF, 3, 7, 5, 5, 5, 2, 128, 128, 32, 2, 4, 4>>("tiny", 0, quick);
  run_case<HSpec<f16, FH, 3, 7, 5, 5, 5, 2, 64, 64, 64, 2, 2, 3>>("tiny", 0, quick);
  run_case<HSpec<bf16, BF, 33, 17, 1, 1, 1, 2, 128, 128, 32, 2, 4, 4>>("K=1", 0, quick);
  run_case<HSpec<f16, FH, 300, 1, 64, 64, 64, 16, 64, 64, 16, 2, 2, 2>>("N=1", 0, quick);
  run_case<HSpec<bf16, BF, 200, 129, 333, 333, 333, 2, 64, 96, 32, 2, 4, 5>>("oddNT", 0, quick);
  run_case<HSpec<bf16, BF, 1024, 1024, 1024, 1024, 1024, 16, 128, 128, 32, 2, 4, 4>>("sq", 0,
                                                                                     quick);
  run_case<HSpec<f16, FH, 1024, 1024, 1024, 1024, 1024, 16, 128, 256, 32, 2, 4, 3>>("sq", 0, quick);
  run_case<HSpec<bf16, BF, 1024, 1024, 1024, 1024, 1024, 16, 256, 128, 64, 4, 2, 3>>("sq", 0,
                                                                                     quick);
  run_case<HSpec<float, TF, 129, 200, 1000, 1000, 1000, 16, 128, 128, 16, 2, 4, 4>>("tail", 0,
                                                                                    quick);
  run_case<HSpec<float, TF, 129, 200, 1000, 1001, 1001, 4, 128, 128, 32, 2, 2, 3>>("tail", 0,
                                                                                   quick);
  run_case<HSpec<float, TF, 129, 200, 1000, 1001, 1001, 4, 128, 128, 32, 2, 2, 3, false>>("tail", 0,
                                                                                          quick);
  run_case<HSpec<float, TF, 3, 7, 5, 5, 5, 4, 64, 64, 8, 2, 2, 3>>("tiny", 0, quick);
  run_case<HSpec<float, TF, 1024, 1024, 1024, 1024, 1024, 16, 128, 128, 32, 2, 4, 3>>("sq", 0,
                                                                                      quick);
  run_case<HSpec<float, TF, 1024, 1024, 1024, 1024, 1024, 16, 128, 128, 32, 2, 4, 3, false>>(
      "sq", 0, quick);
  run_case<HSpec<float, SF, 129, 200, 1000, 1000, 1000, 16, 128, 128, 8, 2, 4, 2>>("tail", 0,
                                                                                   quick);
  run_case<HSpec<float, SF, 3, 7, 5, 5, 5, 4, 128, 128, 8, 2, 4, 3>>("tiny", 0, quick);
  run_case<HSpec<float, SF, 130, 70, 77, 78, 78, 8, 64, 128, 16, 2, 2, 4>>("tail", 0, quick);
  run_case<HSpec<float, SF, 1024, 1024, 1024, 1024, 1024, 16, 128, 128, 8, 4, 2, 3>>("sq", 0,
                                                                                     quick);

  // --- timed: square 4096, and the product's target shapes ---------------------------------
  if (!quick) {
    std::printf("mma.sync register-only peak: bf16 %.1f  fp16 %.1f  tf32 %.1f TFLOP/s\n",
                mma_peak_tflops<BF>(prop.multiProcessorCount),
                mma_peak_tflops<FH>(prop.multiProcessorCount),
                mma_peak_tflops<TF>(prop.multiProcessorCount));
  }
  run_case<HSpec<bf16, BF, 4096, 4096, 4096, 4096, 4096, 16, 128, 256, 64, 2, 4, 3>>("big", 1,
                                                                                     quick);
  run_case<HSpec<bf16, BF, 4096, 4096, 4096, 4096, 4096, 16, 128, 256, 128, 2, 4, 2>>("big", 1,
                                                                                      quick);
  run_case<HSpec<bf16, BF, 4096, 4096, 4096, 4096, 4096, 16, 128, 128, 64, 2, 2, 3>>("big", 1,
                                                                                     quick);
  run_case<HSpec<bf16, BF, 4096, 4096, 4096, 4096, 4096, 16, 128, 128, 32, 2, 4, 4>>("big", 1,
                                                                                     quick);
  run_case<HSpec<bf16, BF, 1024, 8192, 8192, 8192, 8192, 16, 128, 256, 64, 2, 4, 3>>("target", 1,
                                                                                     quick);
  run_case<HSpec<bf16, BF, 1024, 8192, 8192, 8192, 8192, 16, 128, 128, 64, 2, 2, 3>>("target", 1,
                                                                                     quick);
  run_case<HSpec<bf16, BF, 16384, 4096, 4096, 4096, 4096, 16, 128, 256, 64, 2, 4, 3>>("target", 1,
                                                                                      quick);
  run_case<HSpec<bf16, BF, 16384, 4096, 4096, 4096, 4096, 16, 128, 128, 64, 2, 2, 3>>("target", 1,
                                                                                      quick);
  run_case<HSpec<f16, FH, 4096, 4096, 4096, 4096, 4096, 16, 128, 256, 64, 2, 4, 3>>("big", 1,
                                                                                    quick);
  run_case<HSpec<float, TF, 4096, 4096, 4096, 4096, 4096, 16, 128, 128, 32, 2, 2, 3>>("big", 1,
                                                                                      quick);
  run_case<HSpec<float, TF, 4096, 4096, 4096, 4096, 4096, 16, 128, 256, 32, 2, 4, 3>>("big", 1,
                                                                                      quick);
  run_case<HSpec<float, TF, 4096, 4096, 4096, 4096, 4096, 16, 128, 256, 32, 2, 4, 3, false>>(
      "big", 1, quick);
  run_case<HSpec<float, TF, 4096, 4096, 4096, 4096, 4096, 16, 256, 128, 32, 4, 2, 3>>("big", 1,
                                                                                      quick);
  run_case<HSpec<float, TF, 4096, 4096, 4096, 4096, 4096, 16, 128, 128, 16, 2, 4, 4>>("big", 1,
                                                                                      quick);
  run_case<HSpec<float, SF, 4096, 4096, 4096, 4096, 4096, 16, 128, 128, 8, 2, 4, 2>>("big", 1,
                                                                                     quick);
  run_case<HSpec<float, SF, 4096, 4096, 4096, 4096, 4096, 16, 128, 128, 16, 2, 4, 3>>("big", 1,
                                                                                      quick);
  run_case<HSpec<float, SF, 4096, 4096, 4096, 4096, 4096, 16, 128, 128, 16, 4, 2, 3>>("big", 1,
                                                                                      quick);
  run_case<HSpec<float, SF, 1024, 8192, 8192, 8192, 8192, 16, 128, 128, 16, 4, 2, 3>>("target", 1,
                                                                                      quick);
  // The fused op's default strict-fp32 config on H100 (tiled.128x128x32.w4x2.s3.g8).
  run_case<HSpec<float, SF, 1024, 8192, 8192, 8192, 8192, 16, 128, 128, 32, 4, 2, 3>>("target", 1,
                                                                                      quick);

  CKB(cublasDestroy(g_cublas));
  int fails = 0;
  std::printf("\n%-4s %-62s %10s %8s %8s %6s\n", "", "case", "relerr", "TFLOP/s", "cuBLAS",
              "ratio");
  for (const auto& r : g_results) {
    fails += !r.pass;
    if (r.tflops > 0)
      std::printf("%-4s %-62s %10.2e %8.1f %8.1f %6.3f\n", r.pass ? "ok" : "FAIL", r.name.c_str(),
                  r.err, r.tflops, r.cublas_tflops, r.tflops / r.cublas_tflops);
    else
      std::printf("%-4s %-62s %10.2e\n", r.pass ? "ok" : "FAIL", r.name.c_str(), r.err);
  }
  std::printf("%d of %zu cases failed\n", fails, g_results.size());
  return fails ? 1 : 0;
}
