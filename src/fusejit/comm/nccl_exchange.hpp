// NCCL as fusejit uses it: loaded at run time (dlopen of libnccl.so.2) when the first plan
// with synchronized statistics is made, so libfusejit.so loads and runs everywhere else
// without NCCL, and a process that already holds NCCL (PyTorch's, an application's) shares that
// one copy, which its communicators belong to. Built without nccl.h, the same calls throw.
#pragma once
#include <cuda.h>

#include <cstddef>
#include <string>

struct ncclComm;

namespace fusejit {

// True when this build knows NCCL (nccl.h at build time) and libnccl.so.2 loads here;
// otherwise *why_not says why. Never throws.
bool nccl_available(std::string* why_not = nullptr);

// The caller's communicator, checked once: its size must be `ranks`. all_gather() is the hot
// path: one ncclAllGather enqueued on the stream, no host sync.
class StatsExchange {
 public:
  // Throws InvalidArgument("stats_comm") for a null communicator or one whose size is not
  // `ranks`, UnsupportedDevice when NCCL is unavailable (nccl_available says why).
  StatsExchange(::ncclComm* comm, int ranks);
  int rank() const { return rank_; }
  int ranks() const { return ranks_; }
  // In place: `records` holds ranks() slots of `slot_bytes`; this rank's slot (rank()) is
  // sent, the others are received. Throws CudaError naming NCCL's error.
  void all_gather(void* records, std::size_t slot_bytes, CUstream stream) const;

 private:
  ::ncclComm* comm_ = nullptr;
  int rank_ = 0, ranks_ = 0;
};

}  // namespace fusejit
