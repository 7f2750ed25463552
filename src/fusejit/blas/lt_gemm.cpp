#include "fusejit/blas/lt_gemm.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <vector>

#include "fusejit/error.hpp"
#include "fusejit/util/fault.hpp"

namespace fusejit {

void check_lt(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  throw CudaError(
      fmt::format("{} failed: {} ({})", what, cublasLtGetStatusName(s), cublasLtGetStatusString(s)),
      static_cast<int>(s));
}

#define FJ_LT(call) check_lt((call), #call)

void LtHandleDeleter::operator()(cublasLtContext* h) const {
  cublasLtDestroy(h);
}

LtHandle make_lt_handle() {
  cublasLtHandle_t h = nullptr;
  FJ_LT(cublasLtCreate(&h));
  return LtHandle(h);
}

cudaDataType_t lt_type(DType d) {
  switch (storage_type(d)) {
    case DType::fp16:
      return CUDA_R_16F;
    case DType::bf16:
      return CUDA_R_16BF;
    default:
      return CUDA_R_32F;
  }
}

const char* lt_type_name(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_16F:
      return "fp16";
    case CUDA_R_16BF:
      return "bf16";
    case CUDA_R_32F:
      return "fp32";
    default:
      return "?";
  }
}

cublasComputeType_t lt_compute(DType d) {
  return d == DType::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

namespace {

struct DescDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* d) const { cublasLtMatmulDescDestroy(d); }
};
struct LayoutDeleter {
  void operator()(cublasLtMatrixLayoutOpaque_t* l) const { cublasLtMatrixLayoutDestroy(l); }
};
struct PreferenceDeleter {
  void operator()(cublasLtMatmulPreferenceOpaque_t* p) const { cublasLtMatmulPreferenceDestroy(p); }
};
using DescPtr = std::unique_ptr<cublasLtMatmulDescOpaque_t, DescDeleter>;
using LayoutPtr = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LayoutDeleter>;
using PreferencePtr = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, PreferenceDeleter>;

// The stored (rows x cols) of A, B and D for a shape: op(A) is m x k, op(B) k x n.
struct Stored {
  std::uint64_t a_rows, a_cols, b_rows, b_cols, d_rows, d_cols;
};
Stored stored(const LtGemmSpec& s, std::int64_t n, std::int64_t k) {
  const auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
  return {s.trans_a ? u(k) : u(s.m),
          s.trans_a ? u(s.m) : u(k),
          s.trans_b ? u(n) : u(k),
          s.trans_b ? u(k) : u(n),
          u(s.m),
          u(n)};
}

LayoutPtr layout(cudaDataType_t t, std::uint64_t rows, std::uint64_t cols, std::int64_t ld) {
  cublasLtMatrixLayout_t l = nullptr;
  FJ_LT(cublasLtMatrixLayoutCreate(&l, t, rows, cols, ld));
  return LayoutPtr(l);
}

struct Layouts {
  LayoutPtr a, b, d;
};
Layouts layouts(const LtGemmSpec& s, std::int64_t n, std::int64_t k) {
  const Stored st = stored(s, n, k);
  return {layout(s.ab_type, st.a_rows, st.a_cols, s.lda),
          layout(s.ab_type, st.b_rows, st.b_cols, s.ldb),
          layout(s.d_type, st.d_rows, st.d_cols, s.ldd)};
}

// A run's layouts at n x k, initialized in place (no heap).
struct StackLayouts {
  cublasLtMatrixLayoutOpaque_t a{}, b{}, d{};
  StackLayouts(const LtGemmSpec& s, std::int64_t n, std::int64_t k) {
    const Stored st = stored(s, n, k);
    FJ_LT(cublasLtMatrixLayoutInit(&a, s.ab_type, st.a_rows, st.a_cols, s.lda));
    FJ_LT(cublasLtMatrixLayoutInit(&b, s.ab_type, st.b_rows, st.b_cols, s.ldb));
    FJ_LT(cublasLtMatrixLayoutInit(&d, s.d_type, st.d_rows, st.d_cols, s.ldd));
  }
};

}  // namespace

struct LtGemm::Impl {
  DescPtr desc;
  Layouts full;
  cublasLtMatmulAlgo_t algo{};
  // make_for_rows' GEMMs: bit r is set once a run of r rows is known to keep the algorithm.
  std::vector<std::atomic<std::uint64_t>> accepted;
};

LtGemm::~LtGemm() = default;

namespace {

// The heuristic's candidates for `s` (best first), up to `count`; empty when it has none.
std::vector<cublasLtMatmulHeuristicResult_t> heuristic(cublasLtHandle_t h, const LtGemmSpec& s,
                                                       cublasLtMatmulDesc_t desc, const Layouts& l,
                                                       int count) {
  cublasLtMatmulPreference_t pref = nullptr;
  FJ_LT(cublasLtMatmulPreferenceCreate(&pref));
  const PreferencePtr pref_owner(pref);
  const std::uint64_t ws = LtGemm::kMaxWorkspace;
  FJ_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                             sizeof ws));
  const std::uint32_t al_ab = s.ab_alignment, al_d = s.d_alignment;
  FJ_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                             &al_ab, sizeof al_ab));
  FJ_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                             &al_ab, sizeof al_ab));
  FJ_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                             &al_d, sizeof al_d));
  FJ_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                             &al_d, sizeof al_d));
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<std::size_t>(count));
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
      h, desc, l.a.get(), l.b.get(), l.d.get(), l.d.get(), pref, count, results.data(), &found);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) return {};
  check_lt(st, "cublasLtMatmulAlgoGetHeuristic");
  results.resize(static_cast<std::size_t>(std::max(0, found)));
  std::erase_if(results, [](const auto& r) { return r.state != CUBLAS_STATUS_SUCCESS; });
  return results;
}

// Sets `desc`'s attributes for `s`; `bias` is the bias epilogue's pointer (a spec with one only).
void set_desc(cublasLtMatmulDesc_t desc, const LtGemmSpec& s, const void* bias) {
  const cublasOperation_t ta = s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                          tb = s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  FJ_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  FJ_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  if (s.bias_epilogue) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    FJ_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    FJ_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                         sizeof bias));
  }
}

DescPtr make_desc(const LtGemmSpec& s) {
  cublasLtMatmulDesc_t desc = nullptr;
  FJ_LT(cublasLtMatmulDescCreate(&desc, s.compute, CUDA_R_32F));
  DescPtr owner(desc);
  set_desc(desc, s, reinterpret_cast<const void*>(LtGemm::kBiasAlignmentHint));
  return owner;
}

std::string describe(const LtGemmSpec& s) {
  return fmt::format("{}x{}x{} {}{} {} -> {} (lda {}, ldb {}, ldd {}, alignment {}/{}){}", s.m, s.n,
                     s.k, s.trans_a ? 'T' : 'N', s.trans_b ? 'T' : 'N', lt_type_name(s.ab_type),
                     lt_type_name(s.d_type), s.lda, s.ldb, s.ldd, s.ab_alignment, s.d_alignment,
                     s.bias_epilogue ? " with a bias epilogue" : "");
}

}  // namespace

std::unique_ptr<LtGemm> LtGemm::make(cublasLtHandle_t h, const LtGemmSpec& s) {
  auto g = std::unique_ptr<LtGemm>(new LtGemm);
  g->impl_ = std::make_unique<Impl>();
  g->spec_ = s;
  g->impl_->desc = make_desc(s);
  g->impl_->full = layouts(s, s.n, s.k);
  const auto results = heuristic(h, s, g->impl_->desc.get(), g->impl_->full, 1);
  if (results.empty()) return nullptr;
  g->impl_->algo = results.front().algo;
  g->workspace_ = results.front().workspaceSize;
  return g;
}

std::unique_ptr<LtGemm> LtGemm::require(cublasLtHandle_t h, const LtGemmSpec& s) {
  auto g = make(h, s);
  if (!g)
    throw CudaError(fmt::format("cuBLASLt has no algorithm for {}", describe(s)),
                    CUBLAS_STATUS_NOT_SUPPORTED);
  return g;
}

std::unique_ptr<LtGemm> LtGemm::make_for_rows(cublasLtHandle_t h, const LtGemmSpec& s,
                                              bool rows_are_n, std::int64_t least) {
  auto g = std::unique_ptr<LtGemm>(new LtGemm);
  g->impl_ = std::make_unique<Impl>();
  g->spec_ = s;
  g->rows_are_n_ = rows_are_n;
  g->impl_->desc = make_desc(s);
  g->impl_->full = layouts(s, s.n, s.k);
  // The row counts checked: `least`, every power of two above it, the midpoint and full - 1
  // (cuBLASLt's kernels pick tiles and splits by size, so refusals come in ranges).
  const std::int64_t full = rows_are_n ? s.n : s.k;
  std::vector<std::int64_t> fewer{std::min(least, full), (least + full) / 2, full - 1};
  for (std::int64_t r = 2; r < full; r *= 2)
    if (r > least) fewer.push_back(r);
  std::erase_if(fewer, [&](std::int64_t r) { return r < std::min(least, full) || r >= full; });
  std::vector<Layouts> few;
  for (const std::int64_t r : fewer)
    few.push_back(rows_are_n ? layouts(s, r, s.k) : layouts(s, s.n, r));
  cublasLtMatmulDesc_t desc = g->impl_->desc.get();
  for (const auto& r : heuristic(h, s, desc, g->impl_->full, 8)) {
    std::size_t ws = r.workspaceSize;
    bool all = true;
    for (const Layouts& l : few) {
      cublasLtMatmulHeuristicResult_t check{};
      if (cublasLtMatmulAlgoCheck(h, desc, l.a.get(), l.b.get(), l.d.get(), l.d.get(), &r.algo,
                                  &check) != CUBLAS_STATUS_SUCCESS ||
          check.workspaceSize > kMaxWorkspace) {
        all = false;
        break;
      }
      ws = std::max(ws, check.workspaceSize);
    }
    if (!all) continue;
    g->impl_->algo = r.algo;
    g->workspace_ = ws;
    g->impl_->accepted = std::vector<std::atomic<std::uint64_t>>(
        static_cast<std::size_t>(std::min(full, kRememberedRows)) / 64 + 1);
    for (const std::int64_t c : fewer) g->mark_accepted(c);
    g->mark_accepted(full);
    return g;
  }
  return nullptr;
}

std::unique_ptr<LtGemm> LtGemm::require_for_rows(cublasLtHandle_t h, const LtGemmSpec& s,
                                                 bool rows_are_n, std::int64_t least) {
  if (!fault::fire(Fault::lt_no_algorithm))
    if (auto g = make_for_rows(h, s, rows_are_n, least)) return g;
  const std::int64_t full = rows_are_n ? s.n : s.k;
  throw CudaError(fmt::format("cuBLASLt has no algorithm for {} that also runs {} = {}..{}",
                              describe(s), rows_are_n ? "n" : "k", std::min(least, full), full),
                  CUBLAS_STATUS_NOT_SUPPORTED);
}

void LtGemm::mark_accepted(std::int64_t rows) const {
  const auto r = static_cast<std::size_t>(rows);
  if (r / 64 < impl_->accepted.size())
    impl_->accepted[r / 64].fetch_or(std::uint64_t{1} << (r % 64), std::memory_order_relaxed);
}

bool LtGemm::runs_rows(cublasLtHandle_t h, std::int64_t rows, std::size_t ws_bytes) const {
  if (impl_->accepted.empty()) return rows == (rows_are_n_ ? spec_.n : spec_.k);
  const auto r = static_cast<std::size_t>(rows);
  if (r / 64 < impl_->accepted.size() &&
      (impl_->accepted[r / 64].load(std::memory_order_relaxed) >> (r % 64) & 1) != 0)
    return true;
  if (fault::fire(Fault::lt_rows_refused)) return false;
  StackLayouts l(spec_, rows_are_n_ ? rows : spec_.n, rows_are_n_ ? spec_.k : rows);
  cublasLtMatmulHeuristicResult_t check{};
  if (cublasLtMatmulAlgoCheck(h, impl_->desc.get(), &l.a, &l.b, &l.d, &l.d, &impl_->algo, &check) !=
          CUBLAS_STATUS_SUCCESS ||
      check.workspaceSize > ws_bytes)
    return false;
  mark_accepted(rows);
  return true;
}

std::string LtGemm::algo_summary() const {
  // Each attribute has its own width (cublasLt.h); the size is checked.
  auto get = [this]<class V>(cublasLtMatmulAlgoConfigAttributes_t attr, V) {
    V v{};
    std::size_t written = 0;
    FJ_LT(cublasLtMatmulAlgoConfigGetAttribute(&impl_->algo, attr, &v, sizeof v, &written));
    return static_cast<long long>(v);
  };
  return fmt::format("algo {}, tile id {}, stages id {}, cluster id {}, split-K {}, swizzle {}",
                     get(CUBLASLT_ALGO_CONFIG_ID, std::int32_t{}),
                     get(CUBLASLT_ALGO_CONFIG_TILE_ID, std::uint32_t{}),
                     get(CUBLASLT_ALGO_CONFIG_STAGES_ID, std::uint32_t{}),
                     get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, std::uint16_t{}),
                     get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM, std::int32_t{}),
                     get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, std::uint32_t{}));
}

void LtGemm::run(cublasLtHandle_t h, CUstream stream, const void* a, const void* b, void* d,
                 const void* bias, void* ws, std::size_t ws_bytes, bool accumulate,
                 std::int64_t rows) const {
  cublasLtMatmulDesc_t desc = impl_->desc.get();
  // The bias pointer is a run's: it goes into a descriptor of this run's own, on the stack, so
  // that two threads running one LtGemm never write the shared one.
  cublasLtMatmulDescOpaque_t run_desc{};
  if (spec_.bias_epilogue) {
    FJ_LT(cublasLtMatmulDescInit(&run_desc, spec_.compute, CUDA_R_32F));
    set_desc(&run_desc, spec_, bias);
    desc = &run_desc;
  }
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  cublasLtMatrixLayout_t la = impl_->full.a.get(), lb = impl_->full.b.get(),
                         ld = impl_->full.d.get();
  // A run of fewer rows: the same matrices' layouts at its size, initialized in place (no heap).
  const std::int64_t full = rows_are_n_ ? spec_.n : spec_.k;
  std::optional<StackLayouts> few;
  if (rows >= 0 && rows != full) {
    few.emplace(spec_, rows_are_n_ ? rows : spec_.n, rows_are_n_ ? spec_.k : rows);
    la = &few->a, lb = &few->b, ld = &few->d;
  }
  FJ_LT(cublasLtMatmul(h, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &impl_->algo, ws,
                       ws_bytes, stream));
}

}  // namespace fusejit
