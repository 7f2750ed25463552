// Data-parallel training with synchronized BatchNorm statistics (what nn.SyncBatchNorm does):
// one process per GPU, each running its share of one global batch through a fusejit Plan with
// Problem::stat_ranks = R over an NCCL communicator. The statistics, and so y and the running
// stats, are those of the whole global batch on every rank.
//
//   sync_bn [R]      R ranks on GPUs 0..R-1 (default: every GPU; at least 2)
//
// The parent forks the ranks before anything initialises CUDA or NCCL (neither survives a
// fork). Rank 0 makes the NCCL id and hands it to the others through pipes. Each rank trains 3
// steps on its rows of a 1000-row global batch split unevenly; rank 0 also runs the same steps
// unsynchronized over the whole batch on its GPU. Every rank sends its running stats to the
// parent, which checks that they are the same bits on every rank and that they match the
// single-GPU run (to rounding: the two merge the batch's statistics in different orders).
#include <nccl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <fusejit/fusejit.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

// The driver through fusejit, which loads it at run time: this program starts on machines
// without one and says so instead of failing to load.
#define CHECK_CU(fn, ...) fusejit::check(FUSEJIT_DRIVER_FUNCTION(fn)(__VA_ARGS__), #fn)

namespace {

constexpr std::int64_t kGlobalM = 1000, N = 512, K = 768;
constexpr int kSteps = 3;
constexpr std::uint32_t kSeed = 2024;
constexpr double kThreshold = 1e-5;  // fp32 data; only the merge order differs

void check_nccl(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return;
  const char* last = ncclGetLastError(nullptr);
  throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(r) +
                           (last && *last ? std::string(" (") + last + ")" : std::string()));
}

[[noreturn]] void fail_errno(const char* what) {
  throw std::runtime_error(std::string(what) + ": " + std::strerror(errno));
}

void write_all(int fd, const void* data, std::size_t bytes) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_errno("write");
    p += n, bytes -= static_cast<std::size_t>(n);
  }
}

// Exactly `bytes`, or false at end of file.
bool read_all(int fd, void* data, std::size_t bytes) {
  auto* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::read(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_errno("read");
    if (n == 0) return false;
    p += n, bytes -= static_cast<std::size_t>(n);
  }
  return true;
}

void close_fd(int fd) {
  if (::close(fd) != 0) fail_errno("close");
}

// Rank r's share of the global batch: r + 1 parts of R (R + 1) / 2, the last rank taking what
// rounding leaves (R = 2: 333 and 667 rows).
std::vector<std::int64_t> split_rows(int R) {
  std::vector<std::int64_t> rows(static_cast<std::size_t>(R));
  std::int64_t used = 0;
  for (int r = 0; r + 1 < R; ++r) {
    rows[std::size_t(r)] = kGlobalM * (r + 1) / (std::int64_t{R} * (R + 1) / 2);
    used += rows[std::size_t(r)];
  }
  rows.back() = kGlobalM - used;
  return rows;
}

// The layer and every step's global batch from one seed, so each rank can make the whole batch
// and take its own rows (a real job would load only its shard).
struct Data {
  std::vector<float> w, b, scale, gamma, beta, rm, rv;
  std::vector<std::vector<float>> x;  // per step, [kGlobalM][K]
  Data() {
    std::mt19937 rng(kSeed);
    std::normal_distribution<float> normal;
    auto random = [&](std::size_t n, float s, float o) {
      std::vector<float> v(n);
      for (auto& e : v) e = o + s * normal(rng);
      return v;
    };
    w = random(std::size_t(N) * K, 1.f / std::sqrt(float(K)), 0);
    b = random(N, 0.1f, 0), scale = random(N, 0.2f, 1), gamma = random(N, 0.1f, 1);
    beta = random(N, 0.1f, 0);
    rm.assign(N, 0.f), rv.assign(N, 1.f);
    for (int s = 0; s < kSteps; ++s) x.push_back(random(std::size_t(kGlobalM) * K, 1, 0.5f));
  }
};

struct DeviceArray {
  CUdeviceptr ptr = 0;
  std::size_t bytes = 0;
  explicit DeviceArray(std::size_t n) : bytes(n) { CHECK_CU(cuMemAlloc, &ptr, bytes); }
  DeviceArray(const void* host, std::size_t n) : DeviceArray(n) { put(host, n); }
  ~DeviceArray() {
    if (FUSEJIT_DRIVER_FUNCTION(cuMemFree)(ptr) != CUDA_SUCCESS)
      std::fprintf(stderr, "cuMemFree failed\n");
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  // From pageable memory the copy returns once the source is staged, not once it is on the GPU,
  // and the plan's non-blocking stream does not wait for the legacy stream: wait for it here.
  void put(const void* host, std::size_t n) const {
    CHECK_CU(cuMemcpyHtoD, ptr, host, n);
    CHECK_CU(cuStreamSynchronize, nullptr);
  }
  std::vector<float> get() const {
    std::vector<float> v(bytes / 4);
    CHECK_CU(cuMemcpyDtoH, v.data(), ptr, bytes);
    return v;
  }
  void* p() const { return reinterpret_cast<void*>(ptr); }
};

// The layer's parameters and running stats on this rank's GPU, and x and y of `rows` rows.
struct Layer {
  DeviceArray w, b, scale, gamma, beta, rm, rv, nbt, x, y;
  Layer(const Data& d, std::int64_t rows)
      : w(d.w.data(), d.w.size() * 4),
        b(d.b.data(), N * 4),
        scale(d.scale.data(), N * 4),
        gamma(d.gamma.data(), N * 4),
        beta(d.beta.data(), N * 4),
        rm(d.rm.data(), N * 4),
        rv(d.rv.data(), N * 4),
        nbt(8),
        x(std::size_t(std::max<std::int64_t>(rows, 1)) * K * 4),
        y(std::size_t(std::max<std::int64_t>(rows, 1)) * N * 4) {
    const std::int64_t zero = 0;
    nbt.put(&zero, 8);
  }
  fusejit::Tensors tensors() const {
    fusejit::Tensors t;
    t.x = x.p(), t.w = w.p(), t.y = y.p(), t.bias = b.p(), t.scale = scale.p();
    t.gamma = gamma.p(), t.beta = beta.p(), t.running_mean = rm.p(), t.running_var = rv.p();
    t.num_batches_tracked = reinterpret_cast<std::int64_t*>(nbt.ptr);
    return t;
  }
};

fusejit::Problem layer_problem(std::int64_t M, int ranks) {
  fusejit::Problem p;
  p.M = M, p.N = N, p.K = K;
  p.dtype = fusejit::DType::fp32;
  p.mode = fusejit::Mode::train;
  p.stat_ranks = ranks;
  return p;
}

// Trains `kSteps` steps of rows [first, first + rows) of each global batch through `plan`.
void train(const fusejit::Plan& plan, const Layer& layer, const Data& d, std::int64_t first,
           std::int64_t rows, CUstream stream) {
  for (int s = 0; s < kSteps; ++s) {
    if (rows > 0)
      layer.x.put(d.x[std::size_t(s)].data() + std::size_t(first) * K, std::size_t(rows) * K * 4);
    plan.run(stream, layer.tensors(), rows);
    // The next step's x goes in with a synchronous copy, which does not wait for this stream.
    CHECK_CU(cuStreamSynchronize, stream);
  }
}

// One rank, in its own process: returns the exit code; sends its results on `out`.
int rank_main(int rank, int world, int id_in, const std::vector<int>& id_out, int out) {
  std::string why;
  if (!fusejit::driver_available(&why)) throw std::runtime_error(why);
  // NCCL takes its device from the current context: GPU `rank`'s primary context, the one the
  // plans below use through PlanOptions::device (and the CUDA runtime's for this device).
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  CHECK_CU(cuDeviceGet, &dev, rank);
  CHECK_CU(cuDevicePrimaryCtxRetain, &ctx, dev);
  CHECK_CU(cuCtxSetCurrent, ctx);

  ncclUniqueId id;
  if (rank == 0) {
    check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    for (const int fd : id_out) {
      write_all(fd, &id, sizeof id);
      close_fd(fd);
    }
  } else if (!read_all(id_in, &id, sizeof id)) {
    throw std::runtime_error("rank 0 sent no NCCL id (it failed first)");
  }
  ncclComm_t comm = nullptr;
  check_nccl(ncclCommInitRank(&comm, world, id, rank), "ncclCommInitRank");

  const Data d;
  const std::vector<std::int64_t> rows = split_rows(world);
  std::int64_t first = 0;
  for (int r = 0; r < rank; ++r) first += rows[std::size_t(r)];
  const std::int64_t mine = rows[std::size_t(rank)];
  CUstream stream = nullptr;
  CHECK_CU(cuStreamCreate, &stream, CU_STREAM_NON_BLOCKING);
  std::vector<float> msg;
  {
    // Every rank makes the same plan (for the largest share) and runs it in the same order.
    fusejit::PlanOptions o;
    o.device = rank;
    o.stats_comm = comm;
    const std::int64_t largest = *std::max_element(rows.begin(), rows.end());
    const fusejit::Plan plan(layer_problem(largest, world), o);
    const Layer layer(d, largest);
    train(plan, layer, d, first, mine, stream);
    std::printf("rank %d (GPU %d): %lld of %lld rows, %d steps, config %s\n", rank, rank,
                static_cast<long long>(mine), static_cast<long long>(kGlobalM), kSteps,
                plan.config().key().c_str());
    msg = layer.rm.get();
    const std::vector<float> rv = layer.rv.get();
    msg.insert(msg.end(), rv.begin(), rv.end());
  }
  check_nccl(ncclCommDestroy(comm), "ncclCommDestroy");
  if (rank == 0) {
    // The same steps without synchronization, over the whole global batch on one GPU.
    fusejit::PlanOptions o;
    o.device = rank;
    const fusejit::Plan plan(layer_problem(kGlobalM, 0), o);
    const Layer layer(d, kGlobalM);
    train(plan, layer, d, 0, kGlobalM, stream);
    const std::vector<float> rm = layer.rm.get(), rv = layer.rv.get();
    msg.insert(msg.end(), rm.begin(), rm.end());
    msg.insert(msg.end(), rv.begin(), rv.end());
  }
  CHECK_CU(cuStreamDestroy, stream);
  write_all(out, msg.data(), msg.size() * 4);
  close_fd(out);
  std::fflush(stdout);
  return 0;
}

// ||a - b|| / ||b||.
double relative(const float* a, const float* b, std::size_t n) {
  double e = 0, r = 0;
  for (std::size_t i = 0; i < n; ++i) {
    e += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    r += double(b[i]) * b[i];
  }
  return std::sqrt(e / r);
}

// How many GPUs, asked in a child so that this process never initialises CUDA before it forks
// the ranks. -1 (and *why) without a usable driver.
int gpu_count(std::string* why) {
  int fds[2];
  if (::pipe(fds) != 0) fail_errno("pipe");
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) fail_errno("fork");
  if (pid == 0) {
    int count = -1;
    std::string text;
    if (fusejit::driver_available(&text) &&
        FUSEJIT_DRIVER_FUNCTION(cuDeviceGetCount)(&count) != CUDA_SUCCESS) {
      count = -1, text = "cuDeviceGetCount failed";
    }
    const bool ok = ::write(fds[1], &count, sizeof count) == ssize_t(sizeof count) &&
                    ::write(fds[1], text.data(), text.size()) == ssize_t(text.size());
    ::_exit(ok ? 0 : 1);
  }
  close_fd(fds[1]);
  int count = -1;
  const bool got = read_all(fds[0], &count, sizeof count);
  char buf[1024];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) why->append(buf, std::size_t(n));
  if (n < 0) fail_errno("read");
  close_fd(fds[0]);
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) fail_errno("waitpid");
  if (!got || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error("the GPU probe process failed");
  return count;
}

int run(int argc, char** argv) {
  // NVLink multicast stays off unless the environment asks for it explicitly.
  if (::setenv("NCCL_NVLS_ENABLE", "0", 0) != 0) fail_errno("setenv");
  std::string why;
  const int gpus = gpu_count(&why);
  if (gpus < 0) {
    std::printf(
        "sync_bn: no GPU here (%s).\nOn 2 or more GPUs it would train %d steps of "
        "y = BatchNorm1d(scale * (x W^T + b)) (%lldx%lldx%lld, fp32) with one process per GPU "
        "and the batch statistics synchronized over NCCL, and check the running stats against "
        "a single-GPU run of the whole batch.\n",
        why.c_str(), kSteps, static_cast<long long>(kGlobalM), static_cast<long long>(N),
        static_cast<long long>(K));
    return 0;
  }
  const int world = argc > 1 ? std::atoi(argv[1]) : gpus;
  if (world > gpus || (argc > 1 && world < 1)) {
    std::fprintf(stderr, "sync_bn: asked for %s ranks, this machine has %d GPU(s)\n",
                 argc > 1 ? argv[1] : "?", gpus);
    return 2;
  }
  if (world < 2) {
    std::printf(
        "sync_bn: synchronized statistics need at least 2 ranks (GPUs); %d here, "
        "nothing to do\n",
        world);
    return 0;
  }
  const std::vector<std::int64_t> rows = split_rows(world);
  std::printf("sync_bn: %d ranks, global batch %lld rows split", world,
              static_cast<long long>(kGlobalM));
  for (const std::int64_t r : rows) std::printf(" %lld", static_cast<long long>(r));
  std::printf("\n");

  // Pipes: rank 0 -> rank r (the NCCL id), rank r -> parent (its running stats).
  const auto W = static_cast<std::size_t>(world);
  std::vector<int> id_r(W, -1), id_w(W, -1), out_r(W, -1), out_w(W, -1);
  for (int r = 0; r < world; ++r) {
    int a[2], b[2];
    if (::pipe(a) != 0 || ::pipe(b) != 0) fail_errno("pipe");
    id_r[std::size_t(r)] = a[0], id_w[std::size_t(r)] = a[1];
    out_r[std::size_t(r)] = b[0], out_w[std::size_t(r)] = b[1];
  }
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) fail_errno("fork");
    if (pid == 0) {
      int code = 1;
      try {
        // Only this rank's ends stay open, so every reader sees end of file when its writer
        // exits (rank 0 keeps the id pipes' write ends).
        std::vector<int> id_out;
        for (int q = 0; q < world; ++q) {
          const auto Q = std::size_t(q);
          close_fd(out_r[Q]);
          if (q != r) close_fd(out_w[Q]);
          if (q != r) close_fd(id_r[Q]);
          if (r == 0 && q > 0)
            id_out.push_back(id_w[Q]);
          else
            close_fd(id_w[Q]);
        }
        code = rank_main(r, world, id_r[std::size_t(r)], id_out, out_w[std::size_t(r)]);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  for (int r = 0; r < world; ++r) {
    close_fd(id_r[std::size_t(r)]);
    close_fd(id_w[std::size_t(r)]);
    close_fd(out_w[std::size_t(r)]);
  }

  // Collect everything the ranks send until each closes its pipe. A rank that fails leaves the
  // others waiting in a collective for it, so they are stopped 10 s later (and all at 300 s).
  std::vector<std::vector<float>> got(W);
  std::vector<std::string> bytes(W);
  std::vector<bool> open(W, true), done(W, false);
  std::vector<int> codes(W, -1);
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  double failed_at = -1;
  bool killed = false;
  for (;;) {
    std::vector<pollfd> p;
    std::vector<int> who;
    for (int r = 0; r < world; ++r)
      if (open[std::size_t(r)]) p.push_back({out_r[std::size_t(r)], POLLIN, 0}), who.push_back(r);
    bool all_done = p.empty();
    for (int r = 0; r < world; ++r) all_done = all_done && done[std::size_t(r)];
    if (all_done) break;
    if (!p.empty() && ::poll(p.data(), p.size(), 200) < 0 && errno != EINTR) fail_errno("poll");
    if (p.empty()) ::usleep(200000);
    for (std::size_t i = 0; i < p.size(); ++i) {
      if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const auto R = std::size_t(who[i]);
      char buf[65536];
      const ssize_t n = ::read(out_r[R], buf, sizeof buf);
      if (n < 0 && errno != EINTR) fail_errno("read");
      if (n > 0) bytes[R].append(buf, std::size_t(n));
      if (n == 0) {
        close_fd(out_r[R]);
        open[R] = false;
      }
    }
    for (int r = 0; r < world; ++r) {
      const auto R = std::size_t(r);
      if (done[R]) continue;
      int status = 0;
      const pid_t w = ::waitpid(pids[R], &status, WNOHANG);
      if (w < 0 && errno != EINTR) fail_errno("waitpid");
      if (w != pids[R]) continue;
      done[R] = true;
      codes[R] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      if (codes[R] != 0 && failed_at < 0) failed_at = elapsed();
    }
    if (!killed && ((failed_at >= 0 && elapsed() > failed_at + 10) || elapsed() > 300)) {
      for (int r = 0; r < world; ++r)
        if (!done[std::size_t(r)] && ::kill(pids[std::size_t(r)], SIGKILL) != 0 && errno != ESRCH)
          fail_errno("kill");
      killed = true;
      std::fprintf(stderr, "sync_bn: %s; stopped the other ranks\n",
                   failed_at >= 0 ? "a rank failed" : "timed out after 300 s");
    }
  }
  for (int r = 0; r < world; ++r)
    if (codes[std::size_t(r)] != 0) {
      std::printf("FAILED: rank %d exited with %d\n", r, codes[std::size_t(r)]);
      return 1;
    }
  for (int r = 0; r < world; ++r) {
    const auto R = std::size_t(r);
    const std::size_t want = std::size_t(N) * (r == 0 ? 4 : 2) * 4;
    if (bytes[R].size() != want) {
      std::printf("FAILED: rank %d sent %zu bytes, expected %zu\n", r, bytes[R].size(), want);
      return 1;
    }
    got[R].resize(want / 4);
    std::memcpy(got[R].data(), bytes[R].data(), want);
  }
  // (a) One merge in rank order on every rank: the same bits everywhere.
  bool same = true;
  for (int r = 1; r < world; ++r)
    if (std::memcmp(got[std::size_t(r)].data(), got[0].data(), std::size_t(N) * 2 * 4) != 0) {
      std::printf("rank %d's running stats differ from rank 0's\n", r);
      same = false;
    }
  // (b) The single-GPU run of the whole batch, to rounding.
  const float* sync = got[0].data();
  const float* single = got[0].data() + 2 * N;
  const double e_rm = relative(sync, single, N), e_rv = relative(sync + N, single + N, N);
  std::printf(
      "running stats after %d steps: bit-identical on all %d ranks: %s; relative "
      "difference to one GPU over the whole batch: running_mean %.2e, running_var "
      "%.2e (threshold %.0e)\n",
      kSteps, world, same ? "yes" : "NO", e_rm, e_rv, kThreshold);
  if (!same || !(e_rm < kThreshold) || !(e_rv < kThreshold)) {
    std::printf("FAILED\n");
    return 1;
  }
  std::printf("OK\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sync_bn: %s\n", e.what());
    return 1;
  }
}
