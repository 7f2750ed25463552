// One process per GPU for the multi-GPU programs (tests/multi, bench/sync_stats_bench.cpp).
// The parent forks one child per rank and never touches CUDA or NCCL itself: neither a CUDA
// context nor NCCL's bootstrap state survives fork(), so a parent that had initialised either
// would hand its children a broken copy. Rank 0 makes the NCCL unique id and passes it to the
// other ranks through pipes; every rank sends its results to the parent through its own pipe as
// length-prefixed messages, which the parent hands on in rounds (one message of every rank).
// Header-only; needs nccl.h and fusejit's public driver header.
#pragma once
#include <errno.h>
#include <nccl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "fusejit/driver.hpp"

namespace fusejit::multi {

using Bytes = std::vector<unsigned char>;

[[noreturn]] inline void throw_errno(const std::string& what) {
  throw std::runtime_error(what + ": " + std::strerror(errno));
}

inline void check_nccl(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return;
  const char* last = ncclGetLastError(nullptr);
  throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(r) +
                           (last && *last ? std::string(" (") + last + ")" : std::string()));
}

// NVLink multicast (NVLS) stays off on the machines these programs run on; an explicit setting
// in the environment wins, so someone measuring NVLS on purpose can still do so.
inline void keep_nvlink_multicast_off() {
  if (::setenv("NCCL_NVLS_ENABLE", "0", 0) != 0) throw_errno("setenv(NCCL_NVLS_ENABLE)");
}

inline void write_all(int fd, const void* data, std::size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno("write to a pipe");
    }
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

// Reads exactly `bytes`; false when the writer closed the pipe first.
inline bool read_exact(int fd, void* data, std::size_t bytes) {
  auto* p = static_cast<unsigned char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::read(fd, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno("read from a pipe");
    }
    if (n == 0) return false;
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
  return true;
}

inline void close_fd(int fd) {
  if (fd >= 0 && ::close(fd) != 0) throw_errno("close");
}

// A message under construction: trivially copyable values and arrays of them, in order.
class Writer {
 public:
  template <class T>
  Writer& put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    return put_bytes(&v, sizeof(T));
  }
  Writer& put_bytes(const void* data, std::size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(data);
    bytes_.insert(bytes_.end(), p, p + bytes);
    return *this;
  }
  // A count, then the elements.
  template <class T>
  Writer& put_array(const T* data, std::size_t count) {
    put(static_cast<std::uint64_t>(count));
    return put_bytes(data, count * sizeof(T));
  }
  template <class T>
  Writer& put_vector(const std::vector<T>& v) {
    return put_array(v.data(), v.size());
  }
  Writer& put_string(const std::string& s) { return put_array(s.data(), s.size()); }
  const Bytes& bytes() const { return bytes_; }

 private:
  Bytes bytes_;
};

// Reads a message back in the order it was written; throws when it runs past the end.
class Reader {
 public:
  explicit Reader(const Bytes& b) : b_(b) {}
  template <class T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    T v;
    take(&v, sizeof(T));
    return v;
  }
  template <class T>
  std::vector<T> get_vector() {
    const auto count = static_cast<std::size_t>(get<std::uint64_t>());
    if (count > (b_.size() - pos_) / (sizeof(T) ? sizeof(T) : 1))
      throw std::runtime_error("message: array longer than the message");
    std::vector<T> v(count);
    take(v.data(), count * sizeof(T));
    return v;
  }
  std::string get_string() {
    const std::vector<char> v = get_vector<char>();
    return std::string(v.begin(), v.end());
  }
  bool done() const { return pos_ == b_.size(); }

 private:
  void take(void* dst, std::size_t bytes) {
    if (bytes > b_.size() - pos_) throw std::runtime_error("message: read past its end");
    if (bytes) std::memcpy(dst, b_.data() + pos_, bytes);
    pos_ += bytes;
  }
  const Bytes& b_;
  std::size_t pos_ = 0;
};

struct GpuProbe {
  int count = 0;    // GPUs the driver sees (0 without a driver)
  int min_cc = 0;   // the lowest compute capability among them (major * 10 + minor)
  std::string why;  // without a driver: why not
};

// Asks the driver in a forked child, so this process never initialises CUDA before it forks
// the ranks.
inline GpuProbe probe_gpus() {
  int fds[2];
  if (::pipe(fds) != 0) throw_errno("pipe");
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw_errno("fork");
  if (pid == 0) {
    int code = 0;
    try {
      close_fd(fds[0]);
      GpuProbe g;
      if (fusejit::driver_available(&g.why)) {
        fusejit::check(FUSEJIT_DRIVER_FUNCTION(cuDeviceGetCount)(&g.count), "cuDeviceGetCount");
        for (int i = 0; i < g.count; ++i) {
          CUdevice dev = 0;
          int major = 0, minor = 0;
          fusejit::check(FUSEJIT_DRIVER_FUNCTION(cuDeviceGet)(&dev, i), "cuDeviceGet");
          fusejit::check(FUSEJIT_DRIVER_FUNCTION(cuDeviceGetAttribute)(
                             &major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
                         "cuDeviceGetAttribute");
          fusejit::check(FUSEJIT_DRIVER_FUNCTION(cuDeviceGetAttribute)(
                             &minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
                         "cuDeviceGetAttribute");
          const int cc = major * 10 + minor;
          g.min_cc = i == 0 ? cc : std::min(g.min_cc, cc);
        }
      }
      Writer w;
      w.put(g.count).put(g.min_cc).put_string(g.why);
      write_all(fds[1], w.bytes().data(), w.bytes().size());
      close_fd(fds[1]);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "GPU probe: %s\n", e.what());
      code = 1;
    }
    std::fflush(nullptr);
    ::_exit(code);
  }
  close_fd(fds[1]);
  Bytes all;
  unsigned char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno("read from the GPU probe");
    }
    if (n == 0) break;
    all.insert(all.end(), buf, buf + n);
  }
  close_fd(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) throw_errno("waitpid(GPU probe)");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || all.empty())
    throw std::runtime_error("the GPU probe process failed");
  Reader r(all);
  GpuProbe g;
  g.count = r.get<int>();
  g.min_cc = r.get<int>();
  g.why = r.get_string();
  return g;
}

// What a rank's body gets: who it is, the id to make the communicator from, and the way to
// its parent.
struct RankContext {
  int rank = 0, world = 0;
  ncclUniqueId id{};
  int out_fd = -1;

  // One message to the parent (a 64-bit length, then the bytes). Blocks while the pipe is full,
  // so a rank should not run far ahead of the others: the parent drains in rounds.
  void send(const Writer& w) const {
    const auto n = static_cast<std::uint64_t>(w.bytes().size());
    write_all(out_fd, &n, sizeof n);
    write_all(out_fd, w.bytes().data(), w.bytes().size());
  }
};

// The communicator of all ranks, made on the calling thread's current device (NCCL takes the
// device from the current context, so the caller makes its GPU current first).
class Communicator {
 public:
  explicit Communicator(const RankContext& ctx) {
    check_nccl(ncclCommInitRank(&comm_, ctx.world, ctx.id, ctx.rank), "ncclCommInitRank");
  }
  ~Communicator() {
    if (!comm_) return;
    const ncclResult_t r = ncclCommDestroy(comm_);
    if (r != ncclSuccess) std::fprintf(stderr, "ncclCommDestroy: %s\n", ncclGetErrorString(r));
  }
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  ncclComm_t get() const { return comm_; }

 private:
  ncclComm_t comm_ = nullptr;
};

struct LaunchResult {
  // Per rank: its exit status, 128 + signal when killed (SIGKILL from the parent after a
  // failure elsewhere or the timeout among them).
  std::vector<int> exit_codes;
  int rounds = 0;  // complete rounds handed to on_round
  bool timed_out = false;
  std::string problems;  // what the parent saw go wrong, "; "-separated
  bool ok() const {
    if (timed_out || !problems.empty()) return false;
    for (const int c : exit_codes)
      if (c != 0) return false;
    return true;
  }
};

using RankBody = std::function<int(RankContext&)>;
using RoundHandler = std::function<void(std::vector<Bytes>& messages)>;

namespace detail {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline int status_code(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

[[noreturn]] inline void run_rank(int rank, int world, std::vector<int>& id_read,
                                  std::vector<int>& id_write, std::vector<int>& out_read,
                                  std::vector<int>& out_write, const RankBody& body) {
  int code = 0;
  try {
    // A rank outliving its parent (ctest's timeout killed it) would hold its GPU forever.
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) throw_errno("prctl(PR_SET_PDEATHSIG)");
    // Keep only this rank's ends: a write end left open in another process would keep the
    // parent from ever seeing end-of-file on that pipe.
    for (int r = 0; r < world; ++r) {
      close_fd(out_read[static_cast<std::size_t>(r)]);
      if (r != rank) close_fd(out_write[static_cast<std::size_t>(r)]);
      if (r != rank) close_fd(id_read[static_cast<std::size_t>(r)]);
      if (rank != 0) close_fd(id_write[static_cast<std::size_t>(r)]);
    }
    RankContext ctx;
    ctx.rank = rank;
    ctx.world = world;
    ctx.out_fd = out_write[static_cast<std::size_t>(rank)];
    if (rank == 0) {
      check_nccl(ncclGetUniqueId(&ctx.id), "ncclGetUniqueId");
      for (int r = 1; r < world; ++r) {
        write_all(id_write[static_cast<std::size_t>(r)], &ctx.id, sizeof ctx.id);
        close_fd(id_write[static_cast<std::size_t>(r)]);
      }
      close_fd(id_write[0]);
    } else if (!read_exact(id_read[static_cast<std::size_t>(rank)], &ctx.id, sizeof ctx.id)) {
      throw std::runtime_error("rank 0 sent no NCCL id (it failed before it could)");
    }
    close_fd(id_read[static_cast<std::size_t>(rank)]);
    code = body(ctx);
    close_fd(ctx.out_fd);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    code = 101;
  } catch (...) {
    std::fprintf(stderr, "rank %d: unknown exception\n", rank);
    code = 101;
  }
  std::fflush(nullptr);
  // No destructors or atexit handlers of the parent's copy of the program run here.
  ::_exit(code);
}

}  // namespace detail

// Forks `world` ranks; rank r runs body(ctx) and exits with what it returns (101 when it
// throws, after printing why on stderr). Each time every rank has delivered its next message,
// the parent calls on_round(messages), messages[r] being rank r's: ranks that send one message
// per step of a loop they all run stay within one step of each other, and the pipes never fill
// while a rank waits in a collective for one the parent is not reading. When a rank fails the
// others are likely blocked in a collective with it, so they are killed `grace_s` later; all
// are killed at `timeout_s`. If on_round throws, the ranks are killed and the exception goes on.
inline LaunchResult launch_ranks(int world, const RankBody& body, const RoundHandler& on_round,
                                 double timeout_s, double grace_s = 10.0) {
  if (world < 1) throw std::invalid_argument("launch_ranks: world must be at least 1");
  keep_nvlink_multicast_off();
  const auto W = static_cast<std::size_t>(world);
  std::vector<int> id_read(W, -1), id_write(W, -1), out_read(W, -1), out_write(W, -1);
  for (std::size_t r = 0; r < W; ++r) {
    int a[2], b[2];
    if (::pipe(a) != 0 || ::pipe(b) != 0) throw_errno("pipe");
    id_read[r] = a[0], id_write[r] = a[1], out_read[r] = b[0], out_write[r] = b[1];
  }
  std::fflush(nullptr);
  std::vector<pid_t> pids(W, -1);
  LaunchResult res;
  res.exit_codes.assign(W, -1);
  std::vector<bool> reaped(W, false);
  auto kill_live = [&](const char* why) {
    for (std::size_t r = 0; r < W; ++r)
      if (pids[r] > 0 && !reaped[r]) {
        if (::kill(pids[r], SIGKILL) != 0 && errno != ESRCH) throw_errno("kill");
        if (why)
          res.problems += std::string(res.problems.empty() ? "" : "; ") + "rank " +
                          std::to_string(r) + " killed: " + why;
      }
  };
  auto reap_all = [&] {
    for (std::size_t r = 0; r < W; ++r) {
      if (pids[r] <= 0 || reaped[r]) continue;
      int status = 0;
      while (::waitpid(pids[r], &status, 0) < 0)
        if (errno != EINTR) throw_errno("waitpid");
      reaped[r] = true;
      res.exit_codes[r] = detail::status_code(status);
    }
  };
  for (std::size_t r = 0; r < W; ++r) {
    pids[r] = ::fork();
    if (pids[r] < 0) {
      const int err = errno;
      kill_live("fork failed for a later rank");
      reap_all();
      errno = err;
      throw_errno("fork");
    }
    if (pids[r] == 0)
      detail::run_rank(static_cast<int>(r), world, id_read, id_write, out_read, out_write, body);
  }
  for (std::size_t r = 0; r < W; ++r) {
    close_fd(id_read[r]);
    close_fd(id_write[r]);
    close_fd(out_write[r]);
  }
  try {
    std::vector<Bytes> partial(W);
    std::vector<std::deque<Bytes>> ready(W);
    std::vector<bool> eof(W, false);
    const double start = detail::now_s();
    double failed_at = -1;
    std::size_t open = W;
    while (open > 0) {
      std::vector<pollfd> pfds;
      std::vector<std::size_t> who;
      for (std::size_t r = 0; r < W; ++r)
        if (!eof[r]) {
          pfds.push_back({out_read[r], POLLIN, 0});
          who.push_back(r);
        }
      const int n = ::poll(pfds.data(), pfds.size(), 200);
      if (n < 0 && errno != EINTR) throw_errno("poll");
      for (std::size_t i = 0; n > 0 && i < pfds.size(); ++i) {
        if (!(pfds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const std::size_t r = who[i];
        unsigned char buf[1 << 16];
        const ssize_t got = ::read(out_read[r], buf, sizeof buf);
        if (got < 0) {
          if (errno == EINTR) continue;
          throw_errno("read from a rank");
        }
        if (got == 0) {
          eof[r] = true;
          --open;
          close_fd(out_read[r]);
          out_read[r] = -1;
          continue;
        }
        partial[r].insert(partial[r].end(), buf, buf + got);
        // Cut complete frames off the front.
        std::size_t pos = 0;
        while (partial[r].size() - pos >= sizeof(std::uint64_t)) {
          std::uint64_t len = 0;
          std::memcpy(&len, partial[r].data() + pos, sizeof len);
          if (partial[r].size() - pos - sizeof len < len) break;
          const auto first = partial[r].begin() + static_cast<std::ptrdiff_t>(pos + sizeof len);
          ready[r].emplace_back(first, first + static_cast<std::ptrdiff_t>(len));
          pos += sizeof len + len;
        }
        partial[r].erase(partial[r].begin(), partial[r].begin() + static_cast<std::ptrdiff_t>(pos));
      }
      for (;;) {
        bool all = true;
        for (std::size_t r = 0; r < W; ++r) all = all && !ready[r].empty();
        if (!all) break;
        std::vector<Bytes> round(W);
        for (std::size_t r = 0; r < W; ++r) {
          round[r] = std::move(ready[r].front());
          ready[r].pop_front();
        }
        on_round(round);
        ++res.rounds;
      }
      for (std::size_t r = 0; r < W; ++r) {
        if (reaped[r]) continue;
        int status = 0;
        const pid_t p = ::waitpid(pids[r], &status, WNOHANG);
        if (p < 0 && errno != EINTR) throw_errno("waitpid");
        if (p != pids[r]) continue;
        reaped[r] = true;
        res.exit_codes[r] = detail::status_code(status);
        if (res.exit_codes[r] != 0 && failed_at < 0) failed_at = detail::now_s();
      }
      const double t = detail::now_s();
      if (failed_at >= 0 && t > failed_at + grace_s) {
        kill_live("another rank failed");
        failed_at = 1e300;  // killed once is enough
      }
      if (t > start + timeout_s) {
        res.timed_out = true;
        kill_live("timeout");
        break;
      }
    }
    for (std::size_t r = 0; r < W; ++r) {
      if (out_read[r] >= 0) close_fd(out_read[r]);
      if (!partial[r].empty())
        res.problems += std::string(res.problems.empty() ? "" : "; ") + "rank " +
                        std::to_string(r) + " left a truncated message";
      if (!ready[r].empty())
        res.problems += std::string(res.problems.empty() ? "" : "; ") + "rank " +
                        std::to_string(r) + " sent " + std::to_string(ready[r].size()) +
                        " message(s) the other ranks did not match";
    }
    reap_all();
  } catch (...) {
    kill_live(nullptr);
    reap_all();
    for (std::size_t r = 0; r < W; ++r)
      if (out_read[r] >= 0) ::close(out_read[r]);
    throw;
  }
  return res;
}

}  // namespace fusejit::multi
