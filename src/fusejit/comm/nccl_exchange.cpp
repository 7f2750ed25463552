#include "fusejit/comm/nccl_exchange.hpp"

#include <fmt/format.h>

#include "fusejit/error.hpp"

#if FUSEJIT_HAVE_NCCL
#include <dlfcn.h>
#include <nccl.h>
#endif

namespace fusejit {

#if FUSEJIT_HAVE_NCCL

namespace {

// The few NCCL functions fusejit calls, with the signatures nccl.h gives them.
struct Nccl {
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclCommCount) comm_count = nullptr;
  decltype(&ncclCommUserRank) comm_user_rank = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclGetLastError) last_error = nullptr;
  std::string error;  // empty when loaded
};

Nccl load() {
  Nccl n;
  // RTLD_NOLOAD first: a copy the process already holds (through PyTorch or the application)
  // is the one its communicators belong to, whatever directory it came from.
  void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
  if (!lib) lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
  if (!lib) {
    n.error = fmt::format(
        "NCCL could not be loaded (libnccl.so.2: {}); synchronized statistics "
        "need it on the library path",
        dlerror());
    return n;
  }
  auto resolve = [&](auto& fn, const char* symbol) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, symbol));
    if (!fn && n.error.empty()) n.error = fmt::format("libnccl.so.2 lacks {}", symbol);
  };
  resolve(n.all_gather, "ncclAllGather");
  resolve(n.comm_count, "ncclCommCount");
  resolve(n.comm_user_rank, "ncclCommUserRank");
  resolve(n.error_string, "ncclGetErrorString");
  resolve(n.last_error, "ncclGetLastError");
  return n;
}

const Nccl& nccl() {
  static const Nccl n = load();
  if (!n.error.empty()) throw UnsupportedDevice(n.error);
  return n;
}

void check_nccl(ncclResult_t r, const char* what, ncclComm* comm) {
  if (r == ncclSuccess) return;
  const Nccl& n = nccl();
  const char* last = n.last_error(comm);
  throw CudaError(fmt::format("{} failed: {} ({})", what, n.error_string(r),
                              last && *last ? last : "no detail"),
                  static_cast<int>(r));
}

}  // namespace

bool nccl_available(std::string* why_not) {
  try {
    nccl();
    if (why_not) why_not->clear();
    return true;
  } catch (const std::exception& e) {
    if (why_not) *why_not = e.what();
    return false;
  }
}

StatsExchange::StatsExchange(::ncclComm* comm, int ranks) : comm_(comm), ranks_(ranks) {
  if (!comm)
    throw InvalidArgument("stats_comm", "expected an NCCL communicator (ncclComm_t); got null");
  const Nccl& n = nccl();
  int count = 0;
  check_nccl(n.comm_count(comm, &count), "ncclCommCount(stats_comm)", comm);
  if (count != ranks)
    throw InvalidArgument("stats_comm",
                          fmt::format("the communicator has {} ranks; problem.stat_ranks is {}: "
                                      "they must agree (every rank's rows form the batch)",
                                      count, ranks));
  check_nccl(n.comm_user_rank(comm, &rank_), "ncclCommUserRank(stats_comm)", comm);
}

void StatsExchange::all_gather(void* records, std::size_t slot_bytes, CUstream stream) const {
  const Nccl& n = nccl();
  auto* base = static_cast<char*>(records);
  check_nccl(n.all_gather(base + static_cast<std::size_t>(rank_) * slot_bytes, base, slot_bytes,
                          ncclUint8, comm_, reinterpret_cast<cudaStream_t>(stream)),
             "ncclAllGather(statistics)", comm_);
}

#else  // built without nccl.h

namespace {
constexpr const char* kNoNccl =
    "this fusejit was built without NCCL (nccl.h was not found when it was configured); "
    "synchronized statistics need a build with NCCL (FUSEJIT_NCCL=ON, FUSEJIT_NCCL_INCLUDE_DIR)";
}

bool nccl_available(std::string* why_not) {
  if (why_not) *why_not = kNoNccl;
  return false;
}

StatsExchange::StatsExchange(::ncclComm* comm, int ranks) : comm_(comm), ranks_(ranks) {
  if (!comm)
    throw InvalidArgument("stats_comm", "expected an NCCL communicator (ncclComm_t); got null");
  throw UnsupportedDevice(kNoNccl);
}

void StatsExchange::all_gather(void*, std::size_t, CUstream) const {
  throw UnsupportedDevice(kNoNccl);
}

#endif

}  // namespace fusejit
