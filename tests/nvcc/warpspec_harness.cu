// Standalone check and benchmark of the warpspec variant (templates/kernels/warpspec_gemm.cuh):
// TMA + mbarrier producer, wgmma consumers, fused BatchNorm epilogue, on sm_90a.
//
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Itemplates -Isrc \
//        tests/nvcc/warpspec_harness.cu -lcuda -lcublasLt -lcublas -o /tmp/w && /tmp/w
//
// Every case runs the fused op (eval: one kernel; train two-pass: GEMM + bn_finalize +
// bn_apply; train single-pass: one kernel) on random data (never zeros) and compares y, the
// running stats and the saved stats with a float64 reference by ||out - ref|| / ||ref||. The
// reference GEMM is float64 on the CPU for small shapes and cuBLASLt with fp32 output for the
// big ones (bf16/fp16 inputs, fp32 accumulate: its error is far below the bf16 rounding of y).
// y is poisoned with NaN first: every valid element must be overwritten, and the padding
// columns (LDY > N) and the guard rows past M must still be NaN afterwards. Big shapes are also
// timed against cuBLASLt's bare GEMM with the same inputs and storage-type output (median of 20
// after warm-up, CUDA events). Options: --quick (small shapes only), --no-time, --filter TEXT
// (only cases whose "config dtype MxNxK mode" contains TEXT).
//
// tests/cpu/warpspec_ptx_test.cpp compiles this file to PTX (no GPU needed) and checks that the
// wgmma / TMA / setmaxnreg instructions are really there.
#include <cublasLt.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "common/math_kind.cuh"
#include "common/params.h"
#include "common/tma_descriptor.cuh"
#include "common/types.cuh"
#include "kernels/bn_apply.cuh"
#include "kernels/bn_finalize.cuh"
#include "kernels/warpspec_gemm.cuh"

#define CK(call)                                                                                  \
  do {                                                                                            \
    cudaError_t e_ = (call);                                                                      \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(2);                                                                               \
    }                                                                                             \
  } while (0)
#define CKLT(call)                                                                               \
  do {                                                                                           \
    cublasStatus_t s_ = (call);                                                                  \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                           \
      std::fprintf(stderr, "%s:%d: %s: cublas status %d\n", __FILE__, __LINE__, #call, int(s_)); \
      std::exit(2);                                                                              \
    }                                                                                            \
  } while (0)
#define CKCU(call)                                                                       \
  do {                                                                                   \
    CUresult r_ = (call);                                                                \
    if (r_ != CUDA_SUCCESS) {                                                            \
      const char* n_ = nullptr;                                                          \
      cuGetErrorName(r_, &n_);                                                           \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, n_ ? n_ : "?"); \
      std::exit(2);                                                                      \
    }                                                                                    \
  } while (0)

namespace {

// ---- Specs -------------------------------------------------------------------------------

template <class T>
constexpr int math_of() {
  if constexpr (std::is_same_v<T, float>)
    return fj::kMathTf32;
  else if constexpr (std::is_same_v<T, fj::half_t>)
    return fj::kMathFp16;
  else
    return fj::kMathBf16;
}

enum Mode { kEval, kTrain2, kTrain1 };

template <class T_, int M_, int N_, int K_, int LDY_, int MODE_, int BM_, int BN_, int STAGES_,
          int CONS_, bool PERS_, bool FRAG_, int CLUSTER_ = 1, bool PP_ = false>
struct WsSpec {
  using T = T_;
  using P = float;
  static constexpr int MATH = math_of<T_>();
  static constexpr int M = M_, N = N_, K = K_, LDX = K_, LDW = K_, LDY = LDY_;
  static constexpr int BM = BM_, BN = BN_, BK = 128 / static_cast<int>(sizeof(T_));
  static constexpr int STAGES = STAGES_, CONSUMERS = CONS_, THREADS = 128 * (CONS_ + 1);
  static constexpr int CLUSTER_M = CLUSTER_;
  static constexpr bool PERSISTENT = PERS_;
  static constexpr int GROUP_M = 8;
  static constexpr int VEC_BYTES = 16;
  static constexpr bool TRAIN = MODE_ != kEval;
  static constexpr bool SINGLE_PASS = MODE_ == kTrain1;
  static constexpr bool FOLD_FINALIZE = false;
  static constexpr bool HAS_BIAS = true, HAS_SCALE = true, HAS_AFFINE = true;
  static constexpr bool CUMULATIVE = false;
  static constexpr bool FRAGMENT_EPILOGUE = FRAG_;
  static constexpr bool PINGPONG = PP_;
  static constexpr int kMode = MODE_;
};

// The launch shape codegen emits.
template <class Spec>
__global__ void __launch_bounds__(Spec::THREADS, 1)
    ws_gemm(const __grid_constant__ fj::Params p, const __grid_constant__ fj::TmaDescriptor tx,
            const __grid_constant__ fj::TmaDescriptor tw) {
  fj::WarpspecGemm<Spec>::run(p, tx, tw, nullptr);
}
template <class Spec>
__global__ void __launch_bounds__(256) ws_finalize(const __grid_constant__ fj::Params p) {
  fj::bn_finalize<Spec>(p);
}
template <class Spec>
__global__ void __launch_bounds__(fj::kApplyThreads)
    ws_apply(const __grid_constant__ fj::Params p) {
  fj::bn_apply<Spec, false>(p);
}

// ---- host helpers -----------------------------------------------------------------------

float bf16_to_float(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest even (inputs are finite)
  return static_cast<uint16_t>(u >> 16);
}
float half_to_float(uint16_t h) {
  const uint32_t s = (h >> 15) & 1u, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  float v;
  if (e == 0)
    v = std::ldexp(static_cast<float>(m), -24);
  else if (e == 31)
    v = m ? NAN : INFINITY;
  else
    v = std::ldexp(static_cast<float>(m | 0x400u), static_cast<int>(e) - 25);
  return s ? -v : v;
}
uint16_t float_to_half(float f) {
  // Inputs here are normal and well inside fp16's range.
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t s = (u >> 16) & 0x8000u;
  int e = static_cast<int>((u >> 23) & 0xFFu) - 127 + 15;
  uint32_t m = u & 0x7FFFFFu;
  if (e <= 0) return static_cast<uint16_t>(s);
  uint32_t r = (static_cast<uint32_t>(e) << 10) | (m >> 13);
  const uint32_t rest = m & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (r & 1u))) ++r;
  return static_cast<uint16_t>(s | r);
}

template <class T>
struct Host;
template <>
struct Host<fj::bf16_t> {
  using S = uint16_t;
  static S from(float f) { return float_to_bf16(f); }
  static double to(S s) { return bf16_to_float(s); }
  static bool is_nan(S s) { return std::isnan(bf16_to_float(s)); }
  static constexpr cudaDataType_t kCuda = CUDA_R_16BF;
  static constexpr CUtensorMapDataType kTma = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  static constexpr const char* kName = "bf16";
  static constexpr double kTol = 1e-2;
};
template <>
struct Host<fj::half_t> {
  using S = uint16_t;
  static S from(float f) { return float_to_half(f); }
  static double to(S s) { return half_to_float(s); }
  static bool is_nan(S s) { return std::isnan(half_to_float(s)); }
  static constexpr cudaDataType_t kCuda = CUDA_R_16F;
  static constexpr CUtensorMapDataType kTma = CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  static constexpr const char* kName = "fp16";
  static constexpr double kTol = 1e-2;
};
template <>
struct Host<float> {
  using S = float;
  static S from(float f) { return f; }
  static double to(S s) { return s; }
  static bool is_nan(S s) { return std::isnan(s); }
  static constexpr cudaDataType_t kCuda = CUDA_R_32F;
  // Rounds to tf32 on load (see src/fusejit/plan/tma_descriptor.cpp).
  static constexpr CUtensorMapDataType kTma = CU_TENSOR_MAP_DATA_TYPE_TFLOAT32;
  static constexpr const char* kName = "tf32";
  static constexpr double kTol = 1e-2;
};

// Own tensor-map builder (the library's lives in src/fusejit/plan/tma_descriptor.cpp and goes
// through the dlopen'ed driver); same parameters.
CUtensorMap make_map(CUtensorMapDataType type, int elem, const void* base, int64_t rows,
                     int64_t cols, int64_t ld, int box_rows) {
  CUtensorMap m;
  std::memset(&m, 0, sizeof(m));
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld * elem)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(128 / elem),
                             static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t es[2] = {1, 1};
  CKCU(cuTensorMapEncodeTiled(&m, type, 2, const_cast<void*>(base), dims, strides, box, es,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  return m;
}

struct Ctx {
  const char* filter = nullptr;  // run only cases whose "name dtype MxNxK mode" contains this
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* lt_ws = nullptr;
  size_t lt_ws_bytes = size_t{64} << 20;
  int sm_count = 0;
  bool time = true;
};

// One shape's inputs and float64 GEMM reference, shared by the cases that use that shape.
struct ShapeData {
  std::string key;
  int M = 0, N = 0, K = 0;
  void* dx = nullptr;
  void* dw = nullptr;
  std::vector<double> a;  // reference x W^T, [M][N]
  std::vector<float> bias, scale, gamma, beta, rm, rv;
  ~ShapeData() {
    if (dx) cudaFree(dx);
    if (dw) cudaFree(dw);
  }
};

// cuBLASLt: D[M][N] (row-major) = X[M][K] W[N][K]^T, i.e. column-major D^T = W^T(op T) X.
struct LtGemm {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;
  LtGemm(Ctx& ctx, cudaDataType_t in, cudaDataType_t out, cublasComputeType_t compute, int M, int N,
         int K, int ldy) {
    CKLT(cublasLtMatmulDescCreate(&op, compute, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CKLT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    CKLT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    CKLT(cublasLtMatrixLayoutCreate(&la, in, K, N, K));
    CKLT(cublasLtMatrixLayoutCreate(&lb, in, K, M, K));
    CKLT(cublasLtMatrixLayoutCreate(&lc, out, N, M, ldy));
    cublasLtMatmulPreference_t pref;
    CKLT(cublasLtMatmulPreferenceCreate(&pref));
    CKLT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                              &ctx.lt_ws_bytes, sizeof(ctx.lt_ws_bytes)));
    cublasLtMatmulHeuristicResult_t h{};
    int n = 0;
    CKLT(cublasLtMatmulAlgoGetHeuristic(ctx.lt, op, la, lb, lc, lc, pref, 1, &h, &n));
    cublasLtMatmulPreferenceDestroy(pref);
    ok = n > 0;
    algo = h.algo;
  }
  ~LtGemm() {
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(op);
  }
  void run(Ctx& ctx, const void* x, const void* w, void* y) {
    const float alpha = 1.f, beta = 0.f;
    CKLT(cublasLtMatmul(ctx.lt, op, &alpha, w, la, x, lb, &beta, y, lc, y, lc, &algo, ctx.lt_ws,
                        ctx.lt_ws_bytes, ctx.stream));
  }
};

template <class T>
std::unique_ptr<ShapeData> make_shape(Ctx& ctx, int M, int N, int K, uint64_t seed) {
  using H = Host<T>;
  using S = typename H::S;
  auto sd = std::make_unique<ShapeData>();
  sd->M = M, sd->N = N, sd->K = K;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  auto nonzero = [&](float lo, float hi) {
    std::uniform_real_distribution<float> d(lo, hi);
    float v;
    do v = d(rng);
    while (std::fabs(v) < 1e-3f);
    return v;
  };
  std::vector<S> hx(static_cast<size_t>(M) * K), hw(static_cast<size_t>(N) * K);
  for (auto& v : hx) v = H::from(nonzero(-1.f, 1.f));
  for (auto& v : hw) v = H::from(nonzero(-1.f, 1.f));
  for (int n = 0; n < N; ++n) {
    sd->bias.push_back(nonzero(-0.5f, 0.5f));
    sd->scale.push_back(nonzero(0.5f, 1.5f));
    sd->gamma.push_back(nonzero(0.5f, 1.5f));
    sd->beta.push_back(nonzero(-0.5f, 0.5f));
    sd->rm.push_back(nonzero(-0.5f, 0.5f));
    sd->rv.push_back(nonzero(0.5f, 2.f));
  }
  CK(cudaMalloc(&sd->dx, hx.size() * sizeof(S)));
  CK(cudaMalloc(&sd->dw, hw.size() * sizeof(S)));
  CK(cudaMemcpy(sd->dx, hx.data(), hx.size() * sizeof(S), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(sd->dw, hw.data(), hw.size() * sizeof(S), cudaMemcpyHostToDevice));
  sd->a.assign(static_cast<size_t>(M) * N, 0.0);
  const double macs = double(M) * N * K;
  if (macs <= 4e9) {
    // float64 on the CPU, rows split over threads.
    std::vector<double> xd(hx.size()), wd(hw.size());
    for (size_t i = 0; i < hx.size(); ++i) xd[i] = H::to(hx[i]);
    for (size_t i = 0; i < hw.size(); ++i) wd[i] = H::to(hw[i]);
    const int nt = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
    std::vector<std::thread> th;
    for (int t = 0; t < nt; ++t)
      th.emplace_back([&, t] {
        for (int m = t; m < M; m += nt)
          for (int n = 0; n < N; ++n) {
            const double* xr = &xd[static_cast<size_t>(m) * K];
            const double* wr = &wd[static_cast<size_t>(n) * K];
            double s = 0;
            for (int k = 0; k < K; ++k) s += xr[k] * wr[k];
            sd->a[static_cast<size_t>(m) * N + n] = s;
          }
      });
    for (auto& t : th) t.join();
  } else {
    float* da = nullptr;
    CK(cudaMalloc(&da, sizeof(float) * M * N));
    // Strict fp32 for float inputs (no TF32): the reference must be more accurate than tf32.
    LtGemm g(ctx, H::kCuda, CUDA_R_32F,
             std::is_same_v<T, float> ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F, M, N, K,
             N);
    if (!g.ok) {
      std::fprintf(stderr, "cuBLASLt found no fp32-output algorithm\n");
      std::exit(2);
    }
    g.run(ctx, sd->dx, sd->dw, da);
    CK(cudaStreamSynchronize(ctx.stream));
    std::vector<float> ha(static_cast<size_t>(M) * N);
    CK(cudaMemcpy(ha.data(), da, ha.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaFree(da));
    for (size_t i = 0; i < ha.size(); ++i) sd->a[i] = ha[i];
    // Spot-check the cuBLAS reference itself against float64 on a few hundred entries.
    std::mt19937 pick(7);
    double num = 0, den = 0;
    for (int s = 0; s < 256; ++s) {
      const int m = static_cast<int>(pick() % M), n = static_cast<int>(pick() % N);
      double r = 0;
      for (int k = 0; k < K; ++k)
        r += H::to(hx[static_cast<size_t>(m) * K + k]) * H::to(hw[static_cast<size_t>(n) * K + k]);
      num +=
          (r - sd->a[static_cast<size_t>(m) * N + n]) * (r - sd->a[static_cast<size_t>(m) * N + n]);
      den += r * r;
    }
    if (std::sqrt(num / den) > 1e-4) {
      std::fprintf(stderr, "cuBLAS fp32 reference disagrees with float64: %.3g\n",
                   std::sqrt(num / den));
      std::exit(2);
    }
  }
  return sd;
}

struct Row {
  std::string name;
  int M, N, K;
  const char* dtype;
  int mode;
  bool pass;
  double err_y, err_stats;
  double ms = 0, ms_total = 0, ms_cublas = 0;
};
std::vector<Row> g_rows;

double rel(const std::vector<double>& out, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double d = out[i] - ref[i];
    num += std::isnan(out[i]) ? 1e300 : d * d;
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

template <class F>
float median_ms(Ctx& ctx, F&& f, int reps = 20) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f();
  CK(cudaStreamSynchronize(ctx.stream));
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(a, ctx.stream));
    f();
    CK(cudaEventRecord(b, ctx.stream));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  CK(cudaGetLastError());
  std::sort(t.begin(), t.end());
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return t[t.size() / 2];
}

std::unique_ptr<ShapeData> g_shape;

template <class Spec>
void run_case(Ctx& ctx, const char* name, bool timed) {
  using T = typename Spec::T;
  using H = Host<T>;
  using S = typename H::S;
  using G = fj::WarpspecGemm<Spec>;
  constexpr int M = Spec::M, N = Spec::N, K = Spec::K, LDY = Spec::LDY;
  if (ctx.filter) {
    const std::string id = std::string(name) + " " + H::kName + " " + std::to_string(M) + "x" +
                           std::to_string(N) + "x" + std::to_string(K) + " " +
                           (Spec::kMode == kEval     ? "eval"
                            : Spec::kMode == kTrain2 ? "train2"
                                                     : "train1");
    if (id.find(ctx.filter) == std::string::npos) return;
  }
  const std::string key = std::string(H::kName) + ":" + std::to_string(M) + "x" +
                          std::to_string(N) + "x" + std::to_string(K);
  if (!g_shape || g_shape->key != key) {
    g_shape.reset();
    g_shape = make_shape<T>(ctx, M, N, K, 1234 + M * 7 + N * 13 + K);
    g_shape->key = key;
  }
  ShapeData& sd = *g_shape;

  // Outputs and parameters. y has kGuardRows extra rows that must stay poisoned.
  constexpr int kGuardRows = 8;
  const size_t y_elems = static_cast<size_t>(M + kGuardRows) * LDY;
  S* dy = nullptr;
  CK(cudaMalloc(&dy, y_elems * sizeof(S)));
  auto dev_vec = [](const std::vector<float>& v) {
    float* d = nullptr;
    CK(cudaMalloc(&d, v.size() * 4));
    CK(cudaMemcpy(d, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
    return d;
  };
  float *d_bias = dev_vec(sd.bias), *d_scale = dev_vec(sd.scale), *d_gamma = dev_vec(sd.gamma),
        *d_beta = dev_vec(sd.beta), *d_rm = dev_vec(sd.rm), *d_rv = dev_vec(sd.rv);
  float *d_save_mean = nullptr, *d_save_invstd = nullptr, *d_part = nullptr, *d_coef = nullptr;
  long long* d_nbt = nullptr;
  constexpr int kRowTiles = (M + Spec::BM - 1) / Spec::BM;
  CK(cudaMalloc(&d_save_mean, N * 4));
  CK(cudaMalloc(&d_save_invstd, N * 4));
  CK(cudaMalloc(&d_part, sizeof(float) * 2 * kRowTiles * N));
  CK(cudaMalloc(&d_coef, sizeof(float) * 4 * N));
  CK(cudaMalloc(&d_nbt, 8));
  CK(cudaMemset(d_nbt, 0, 8));
  CK(cudaMemset(dy, 0xFF, y_elems * sizeof(S)));  // NaN in every storage type
  CK(cudaMemset(d_save_mean, 0xFF, N * 4));
  CK(cudaMemset(d_save_invstd, 0xFF, N * 4));
  CK(cudaMemset(d_part, 0xFF, sizeof(float) * 2 * kRowTiles * N));

  fj::Params p{};
  p.x = sd.dx;
  p.w = sd.dw;
  p.y = dy;
  p.bias = d_bias;
  p.scale = d_scale;
  p.gamma = d_gamma;
  p.beta = d_beta;
  p.running_mean = d_rm;
  p.running_var = d_rv;
  p.num_batches_tracked = d_nbt;
  p.save_mean = d_save_mean;
  p.save_invstd = d_save_invstd;
  p.ws_partials = d_part;
  p.ws_coef = d_coef;
  p.eps = 1e-5f;
  p.m = M;
  p.momentum = 0.1f;

  constexpr int elem = static_cast<int>(sizeof(S));
  const CUtensorMap mx = make_map(H::kTma, elem, sd.dx, M, K, Spec::LDX, Spec::BM);
  const CUtensorMap mw =
      make_map(H::kTma, elem, sd.dw, N, K, Spec::LDW, Spec::BN / Spec::CLUSTER_M);
  fj::TmaDescriptor tx, tw;
  static_assert(sizeof(CUtensorMap) == sizeof(fj::TmaDescriptor));
  std::memcpy(&tx, &mx, sizeof(tx));
  std::memcpy(&tw, &mw, sizeof(tw));

  CK(cudaFuncSetAttribute(ws_gemm<Spec>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          G::kSmemBytes));
  // Untimed (small) cases pretend the GPU has 4 SMs, so that persistent CTAs walk several
  // tiles each (and pingpong groups alternate) even on shapes with few tiles.
  const int grid = G::grid_size(Spec::M, timed ? ctx.sm_count : 4);
  auto launch_gemm = [&] {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(Spec::THREADS);
    cfg.dynamicSmemBytes = G::kSmemBytes;
    cfg.stream = ctx.stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = Spec::CLUSTER_M;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = Spec::CLUSTER_M > 1 ? 1 : 0;
    CK(cudaLaunchKernelEx(&cfg, ws_gemm<Spec>, p, tx, tw));
  };
  auto launch_all = [&] {
    launch_gemm();
    if constexpr (Spec::kMode == kTrain2) {
      using F = fj::FinalizeShape<Spec>;
      using A = fj::ApplyShape<Spec>;
      ws_finalize<Spec><<<F::kGridX, F::kThreads, 0, ctx.stream>>>(p);
      const int slabs = (Spec::M + fj::kApplyBlockRows - 1) / fj::kApplyBlockRows;
      ws_apply<Spec><<<A::kStrips * slabs, fj::kApplyThreads, 0, ctx.stream>>>(p);
    }
  };

  launch_all();
  CK(cudaGetLastError());
  CK(cudaStreamSynchronize(ctx.stream));

  // Fetch and compare.
  std::vector<S> hy(y_elems);
  CK(cudaMemcpy(hy.data(), dy, y_elems * sizeof(S), cudaMemcpyDeviceToHost));
  std::vector<float> h_rm(N), h_rv(N), h_sm(N), h_si(N);
  CK(cudaMemcpy(h_rm.data(), d_rm, N * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(h_rv.data(), d_rv, N * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(h_sm.data(), d_save_mean, N * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(h_si.data(), d_save_invstd, N * 4, cudaMemcpyDeviceToHost));
  long long nbt = -1;
  CK(cudaMemcpy(&nbt, d_nbt, 8, cudaMemcpyDeviceToHost));

  std::vector<double> out(static_cast<size_t>(M) * N), ref(out.size());
  std::vector<double> st_out, st_ref;
  const double eps = 1e-5, f = 0.1;
  for (int n = 0; n < N; ++n) {
    const double b = sd.bias[n], s = sd.scale[n], g = sd.gamma[n], be = sd.beta[n];
    double mean = 0, var = 0;
    if (Spec::TRAIN) {
      for (int m = 0; m < M; ++m) mean += s * (sd.a[static_cast<size_t>(m) * N + n] + b);
      mean /= M;
      for (int m = 0; m < M; ++m) {
        const double d = s * (sd.a[static_cast<size_t>(m) * N + n] + b) - mean;
        var += d * d;
      }
      var /= M;
    } else {
      mean = sd.rm[n];
      var = sd.rv[n];
    }
    const double invstd = 1.0 / std::sqrt(var + eps);
    for (int m = 0; m < M; ++m) {
      const double z = s * (sd.a[static_cast<size_t>(m) * N + n] + b);
      ref[static_cast<size_t>(m) * N + n] = g * (z - mean) * invstd + be;
      out[static_cast<size_t>(m) * N + n] = H::to(hy[static_cast<size_t>(m) * LDY + n]);
    }
    if (Spec::TRAIN) {
      st_ref.push_back((1 - f) * sd.rm[n] + f * mean);
      st_ref.push_back((1 - f) * sd.rv[n] + f * var * M / (M - 1.0));
      st_ref.push_back(mean);
      st_ref.push_back(invstd);
      st_out.push_back(h_rm[n]);
      st_out.push_back(h_rv[n]);
      st_out.push_back(h_sm[n]);
      st_out.push_back(h_si[n]);
    } else {
      // eval must leave the running stats alone
      st_ref.push_back(sd.rm[n]);
      st_ref.push_back(sd.rv[n]);
      st_out.push_back(h_rm[n]);
      st_out.push_back(h_rv[n]);
    }
  }
  size_t nan_valid = 0, clobbered = 0;
  for (int m = 0; m < M + kGuardRows; ++m)
    for (int c = 0; c < LDY; ++c) {
      const bool is_nan = H::is_nan(hy[static_cast<size_t>(m) * LDY + c]);
      if (m < M && c < N)
        nan_valid += is_nan;
      else
        clobbered += !is_nan;
    }
  const double ey = rel(out, ref);
  const double es = rel(st_out, st_ref);
  const bool nbt_ok = Spec::TRAIN ? nbt == 1 : nbt == 0;
  const bool pass = ey <= H::kTol && es <= 2e-3 && nan_valid == 0 && clobbered == 0 && nbt_ok;
  Row row{name, M, N, K, H::kName, Spec::kMode, pass, ey, es};
  std::printf(
      "%-20s %-5s %6dx%-6dx%-6d %-6s smem=%6d grid=%4d y_err=%.2e stats_err=%.2e nan=%zu "
      "clobbered=%zu nbt=%lld  %s\n",
      name, H::kName, M, N, K,
      Spec::kMode == kEval     ? "eval"
      : Spec::kMode == kTrain2 ? "train2"
                               : "train1",
      G::kSmemBytes, grid, ey, es, nan_valid, clobbered, nbt, pass ? "PASS" : "FAIL");
  std::fflush(stdout);

  if (timed && ctx.time) {
    row.ms = median_ms(ctx, launch_gemm);
    row.ms_total = median_ms(ctx, launch_all);
    // The same math as ours: tf32 tensor cores for float, fp32 accumulate throughout.
    LtGemm g(ctx, H::kCuda, H::kCuda,
             std::is_same_v<T, float> ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, M, N, K,
             LDY);
    if (g.ok) row.ms_cublas = median_ms(ctx, [&] { g.run(ctx, sd.dx, sd.dw, dy); });
  }
  g_rows.push_back(row);
  for (void* ptr :
       {static_cast<void*>(dy), static_cast<void*>(d_bias), static_cast<void*>(d_scale),
        static_cast<void*>(d_gamma), static_cast<void*>(d_beta), static_cast<void*>(d_rm),
        static_cast<void*>(d_rv), static_cast<void*>(d_save_mean),
        static_cast<void*>(d_save_invstd), static_cast<void*>(d_part), static_cast<void*>(d_coef),
        static_cast<void*>(d_nbt)})
    CK(cudaFree(ptr));
}

using bf16 = fj::bf16_t;
using f16 = fj::half_t;

// Small shapes with tails in M, N and K: every flavour of the kernel.
//   name                                  T     M    N    K    LDY  mode    BM   BN  S C pers frag
//   cl
void small_cases(Ctx& c) {
  run_case<WsSpec<bf16, 200, 300, 1000, 304, kEval, 128, 256, 4, 2, false, true>>(c, "frag", false);
  run_case<WsSpec<bf16, 200, 300, 1000, 304, kTrain2, 128, 256, 4, 2, false, true>>(c, "frag",
                                                                                    false);
  run_case<WsSpec<bf16, 100, 300, 1000, 304, kTrain1, 128, 256, 4, 2, false, true>>(c, "frag",
                                                                                    false);
  run_case<WsSpec<bf16, 200, 300, 1000, 304, kEval, 128, 256, 4, 2, true, true>>(c, "frag-pers",
                                                                                 false);
  run_case<WsSpec<bf16, 200, 300, 1000, 304, kTrain2, 128, 256, 4, 2, true, true>>(c, "frag-pers",
                                                                                   false);
  run_case<WsSpec<bf16, 200, 300, 1000, 304, kEval, 128, 256, 4, 2, true, true, 2>>(
      c, "frag-pers-cl2", false);
  run_case<WsSpec<bf16, 200, 300, 1000, 304, kTrain2, 128, 256, 4, 2, false, true, 2>>(
      c, "frag-cl2", false);
  run_case<WsSpec<bf16, 200, 300, 1000, 304, kEval, 128, 256, 4, 2, false, false>>(c, "acctile",
                                                                                   false);
  run_case<WsSpec<bf16, 200, 300, 1000, 304, kTrain2, 128, 256, 4, 2, false, false>>(c, "acctile",
                                                                                     false);
  run_case<WsSpec<bf16, 100, 300, 1000, 304, kTrain1, 128, 256, 4, 2, false, false>>(c, "acctile",
                                                                                     false);
  run_case<WsSpec<bf16, 200, 300, 1000, 304, kTrain2, 128, 128, 4, 2, true, false>>(
      c, "acctile-pers", false);
  run_case<WsSpec<bf16, 200, 300, 1000, 304, kEval, 64, 128, 6, 1, false, true>>(c, "frag-c1",
                                                                                 false);
  run_case<WsSpec<bf16, 200, 300, 1000, 304, kTrain2, 256, 128, 3, 2, false, true>>(c, "frag-bm256",
                                                                                    false);
  run_case<WsSpec<f16, 200, 300, 1000, 304, kEval, 128, 256, 4, 2, true, true>>(c, "frag-pers",
                                                                                false);
  run_case<WsSpec<f16, 200, 300, 1000, 304, kTrain2, 128, 128, 5, 2, false, true>>(c, "frag",
                                                                                   false);
  run_case<WsSpec<float, 200, 300, 1000, 304, kEval, 128, 128, 4, 2, true, true>>(c, "frag-pers",
                                                                                  false);
  run_case<WsSpec<float, 200, 300, 1000, 304, kTrain2, 128, 256, 4, 2, false, true>>(c, "frag",
                                                                                     false);
  run_case<WsSpec<bf16, 200, 300, 1000, 304, kEval, 128, 128, 5, 2, true, true, 1, true>>(c, "pp",
                                                                                          false);
  run_case<WsSpec<bf16, 200, 300, 1000, 304, kTrain2, 128, 128, 5, 2, true, true, 1, true>>(c, "pp",
                                                                                            false);
  run_case<WsSpec<bf16, 100, 300, 1000, 304, kTrain1, 128, 128, 5, 2, true, true, 1, true>>(c, "pp",
                                                                                            false);
  run_case<WsSpec<bf16, 200, 300, 1000, 304, kEval, 128, 128, 5, 2, true, true, 2, true>>(
      c, "pp-cl2", false);
  run_case<WsSpec<bf16, 600, 300, 1000, 304, kTrain2, 128, 128, 5, 2, true, true, 2, true>>(
      c, "pp-cl2", false);
  run_case<WsSpec<bf16, 200, 300, 1000, 304, kTrain2, 64, 256, 4, 2, true, true, 1, true>>(
      c, "pp64", false);
  run_case<WsSpec<f16, 200, 300, 1000, 304, kEval, 64, 256, 4, 2, true, true, 2, true>>(
      c, "pp64-cl2", false);
  run_case<WsSpec<float, 200, 300, 1000, 304, kTrain2, 128, 128, 5, 2, true, true, 1, true>>(
      c, "pp", false);
  // Tiny: one partial tile, fewer k-slices than stages, a cluster whose second CTA is past M.
  run_case<WsSpec<bf16, 37, 50, 72, 56, kEval, 128, 256, 4, 2, false, true>>(c, "tiny-frag", false);
  run_case<WsSpec<bf16, 37, 50, 72, 56, kTrain1, 128, 256, 4, 2, false, true>>(c, "tiny-frag",
                                                                               false);
  run_case<WsSpec<bf16, 37, 50, 72, 56, kTrain2, 128, 256, 4, 2, true, true, 2>>(c, "tiny-pers-cl2",
                                                                                 false);
  run_case<WsSpec<bf16, 37, 50, 72, 56, kTrain1, 128, 128, 5, 2, true, true, 1, true>>(c, "tiny-pp",
                                                                                       false);
  run_case<WsSpec<bf16, 37, 50, 72, 56, kTrain2, 128, 256, 4, 2, false, false>>(c, "tiny-acctile",
                                                                                false);
  // Many tiles per persistent CTA (4 CTAs), short K: the producer runs far into later tiles.
  run_case<WsSpec<bf16, 520, 1000, 136, 1000, kEval, 128, 256, 4, 2, true, true>>(c, "many-pers",
                                                                                  false);
  run_case<WsSpec<bf16, 520, 1000, 136, 1000, kTrain2, 128, 256, 4, 2, true, true, 2>>(
      c, "many-pers-cl2", false);
  run_case<WsSpec<bf16, 520, 1000, 136, 1000, kEval, 128, 128, 5, 2, true, true, 2, true>>(
      c, "many-pp-cl2", false);
  run_case<WsSpec<f16, 520, 1000, 136, 1000, kTrain2, 128, 128, 5, 2, true, true, 1, true>>(
      c, "many-pp", false);
}

// Big shapes: checked against the cuBLAS fp32 reference and timed against cuBLASLt.
// Measured on an H100 (see the report): the cooperative persistent 128x256 kernel ("frag-pers")
// is the fastest; clusters of two and pingpong were a few percent slower on these shapes.
template <int M, int N, int K>
void big_cases(Ctx& c) {
  run_case<WsSpec<bf16, M, N, K, N, kEval, 128, 256, 4, 2, true, true>>(c, "frag-pers", true);
  run_case<WsSpec<bf16, M, N, K, N, kEval, 128, 256, 4, 2, true, true, 2>>(c, "frag-pers-cl2",
                                                                           true);
  run_case<WsSpec<bf16, M, N, K, N, kEval, 128, 128, 5, 2, true, true, 1, true>>(c, "pp", true);
  run_case<WsSpec<bf16, M, N, K, N, kTrain2, 128, 256, 4, 2, true, true>>(c, "frag-pers", true);
  run_case<WsSpec<bf16, M, N, K, N, kTrain2, 128, 256, 4, 2, true, true, 2>>(c, "frag-pers-cl2",
                                                                             true);
  run_case<WsSpec<bf16, M, N, K, N, kEval, 128, 256, 4, 2, true, true>>(c, "frag-pers(again)",
                                                                        true);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  Ctx ctx;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    if (!std::strcmp(argv[i], "--no-time")) ctx.time = false;
    if (!std::strcmp(argv[i], "--filter") && i + 1 < argc) ctx.filter = argv[++i];
  }
  CK(cudaSetDevice(0));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  ctx.sm_count = prop.multiProcessorCount;
  std::printf("device: %s, %d SMs, cc %d.%d\n", prop.name, prop.multiProcessorCount, prop.major,
              prop.minor);
  CK(cudaStreamCreate(&ctx.stream));
  CKLT(cublasLtCreate(&ctx.lt));
  CK(cudaMalloc(&ctx.lt_ws, ctx.lt_ws_bytes));

  small_cases(ctx);
  if (!quick) {
    big_cases<1024, 8192, 8192>(ctx);
    run_case<WsSpec<f16, 4096, 4096, 4096, 4096, kEval, 128, 256, 4, 2, true, true>>(
        ctx, "frag-pers", true);
    run_case<WsSpec<float, 4096, 4096, 4096, 4096, kEval, 128, 128, 5, 2, true, true>>(
        ctx, "frag-pers-n128", true);
    big_cases<4096, 4096, 4096>(ctx);
    big_cases<16384, 4096, 4096>(ctx);
  }
  g_shape.reset();

  int fails = 0;
  std::printf("\n%-16s %-5s %-18s %-6s %5s %9s %9s %9s %8s %8s %7s\n", "config", "dtype", "shape",
              "mode", "ok", "gemm_ms", "total_ms", "cublas", "TFLOP/s", "ratio", "y_err");
  for (const Row& r : g_rows) {
    fails += !r.pass;
    if (r.ms <= 0 && r.pass) continue;
    const double flops = 2.0 * r.M * r.N * r.K;
    char shape[32];
    std::snprintf(shape, sizeof(shape), "%dx%dx%d", r.M, r.N, r.K);
    std::printf("%-16s %-5s %-18s %-6s %5s %9.4f %9.4f %9.4f %8.1f %8.3f %7.1e\n", r.name.c_str(),
                r.dtype, shape,
                r.mode == kEval     ? "eval"
                : r.mode == kTrain2 ? "train2"
                                    : "train1",
                r.pass ? "ok" : "FAIL", r.ms, r.ms_total, r.ms_cublas,
                r.ms_total > 0 ? flops / (r.ms_total * 1e9) : 0.0,
                r.ms_cublas > 0 ? r.ms_total / r.ms_cublas : 0.0, r.err_y);
  }
  std::printf("%zu cases, %d failed\n", g_rows.size(), fails);
  return fails ? 1 : 0;
}
