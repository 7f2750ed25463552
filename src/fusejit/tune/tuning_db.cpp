#include "fusejit/tune/tuning_db.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <span>
#include <system_error>
#include <utility>

#include <fmt/format.h>

#include "fusejit/cache/disk_cache.hpp"
#include "fusejit/codegen/backward_codegen.hpp"
#include "fusejit/compile/compiler.hpp"
#include "fusejit/config/candidates.hpp"
#include "fusejit/error.hpp"
#include "fusejit/plan/backward_core.hpp"
#include "fusejit/util/durable_file.hpp"
#include "fusejit/util/hash.hpp"
#include "fusejit/util/log.hpp"

#ifndef FUSEJIT_VERSION
#define FUSEJIT_VERSION "unknown"
#endif

namespace fusejit {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr std::string_view kSchema = "fusejit-tuning-db";
// 2 added "backward_entries". A version-1 file (forward entries only) is still read; a build
// that reads only version 1 moves a version-2 file aside, loudly, rather than rewriting it
// without the backward entries it cannot see.
constexpr int kVersion = 2;
// A few hundred bytes per entry: anything this large under our name is damage, and refusing it
// keeps a hostile file from making us allocate without bound.
constexpr std::size_t kMaxFileBytes = std::size_t{64} << 20;
// The schema nests 4 deep; deeper text is damage, rejected before the JSON parser sees it.
constexpr int kMaxDepth = 16;

[[noreturn]] void damaged(const std::string& what) {
  throw Error(what);
}

// ---------------------------------------------------------------------------------------------
// JSON <-> entries. Every field is checked for presence and type: a file that passes is safe to
// act on (its configs parse, its problems validate, its numbers are finite and positive).

const json& field(const json& obj, const char* name, const std::string& where) {
  auto it = obj.find(name);
  if (it == obj.end()) damaged(fmt::format("{}: missing field '{}'", where, name));
  return *it;
}

std::int64_t get_int(const json& obj, const char* name, const std::string& where,
                     std::int64_t lo = std::numeric_limits<std::int64_t>::min(),
                     std::int64_t hi = std::numeric_limits<std::int64_t>::max()) {
  const json& v = field(obj, name, where);
  if (!v.is_number_integer()) damaged(fmt::format("{}: '{}' must be an integer", where, name));
  if (v.is_number_unsigned() &&
      v.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
    damaged(fmt::format("{}: '{}' is out of range", where, name));
  const auto out = v.get<std::int64_t>();
  if (out < lo || out > hi) damaged(fmt::format("{}: '{}' = {} is out of range", where, name, out));
  return out;
}

double get_double(const json& v, const std::string& what) {
  if (!v.is_number()) damaged(what + " must be a number");
  const double d = v.get<double>();
  if (!std::isfinite(d)) damaged(what + " must be finite");
  return d;
}

double get_positive(const json& obj, const char* name, const std::string& where) {
  const double d = get_double(field(obj, name, where), fmt::format("{}: '{}'", where, name));
  if (!(d > 0)) damaged(fmt::format("{}: '{}' must be positive", where, name));
  return d;
}

std::optional<double> get_optional_positive(const json& obj, const char* name,
                                            const std::string& where) {
  if (field(obj, name, where).is_null()) return std::nullopt;
  return get_positive(obj, name, where);
}

const std::string& get_string(const json& obj, const char* name, const std::string& where) {
  const json& v = field(obj, name, where);
  if (!v.is_string()) damaged(fmt::format("{}: '{}' must be a string", where, name));
  return v.get_ref<const std::string&>();
}

bool get_bool(const json& obj, const char* name, const std::string& where) {
  const json& v = field(obj, name, where);
  if (!v.is_boolean()) damaged(fmt::format("{}: '{}' must be true or false", where, name));
  return v.get<bool>();
}

// A candidate name as stored: a canonical key of the pass's config (parse(k).key() == k), or
// "reference" where `reference_ok` (forward only), or "" where `empty_ok`.
void check_candidate(const std::string& k, const char* name, const std::string& where,
                     TunedPass pass, bool reference_ok, bool empty_ok) {
  const bool backward = pass == TunedPass::backward;
  if (k.empty() && empty_ok) return;
  if (k == kReferenceCandidate && reference_ok && !backward) return;
  try {
    if ((backward ? BackwardConfig::parse(k).key() : KernelConfig::parse(k).key()) == k) return;
  } catch (const InvalidArgument&) {
  }
  damaged(fmt::format("{}: '{}' = '{}' is not a {}{}", where, name, k,
                      backward ? "backward config key" : "kernel config key",
                      reference_ok && !backward ? " or 'reference'" : ""));
}

json problem_json(const Problem& p) {
  return json{{"M", p.M},
              {"N", p.N},
              {"K", p.K},
              {"dtype", name(p.dtype)},
              {"param_dtype", name(p.param_dtype)},
              {"mode", name(p.mode)},
              {"eps", p.eps},
              {"momentum", p.momentum ? json(*p.momentum) : json(nullptr)},
              {"bias", p.has_bias},
              {"scale", p.has_scale},
              {"affine", p.has_affine},
              {"ldx", p.lda_x()},
              {"ldw", p.lda_w()},
              {"ldy", p.lda_y()},
              {"alignment", p.effective_alignment()}};
}

Problem problem_from_json(const json& j, const std::string& where) {
  if (!j.is_object()) damaged(where + ": 'problem' must be an object");
  Problem p;
  constexpr std::int64_t kDimMax = std::numeric_limits<std::int32_t>::max();
  p.M = get_int(j, "M", where, 1, kDimMax);
  p.N = get_int(j, "N", where, 1, kDimMax);
  p.K = get_int(j, "K", where, 1, kDimMax);
  try {
    p.dtype = parse_dtype(get_string(j, "dtype", where));
    p.param_dtype = parse_dtype(get_string(j, "param_dtype", where));
    p.mode = parse_mode(get_string(j, "mode", where));
  } catch (const InvalidArgument& e) {
    damaged(where + ": " + e.what());
  }
  p.eps = get_double(field(j, "eps", where), where + ": 'eps'");
  const json& mom = field(j, "momentum", where);
  p.momentum =
      mom.is_null() ? std::nullopt : std::optional<double>(get_double(mom, where + ": 'momentum'"));
  p.has_bias = get_bool(j, "bias", where);
  p.has_scale = get_bool(j, "scale", where);
  p.has_affine = get_bool(j, "affine", where);
  p.ldx = get_int(j, "ldx", where, 1, kDimMax);
  p.ldw = get_int(j, "ldw", where, 1, kDimMax);
  p.ldy = get_int(j, "ldy", where, 1, kDimMax);
  p.alignment = static_cast<int>(get_int(j, "alignment", where, 1, 16));
  try {
    p.validate();
  } catch (const InvalidArgument& e) {
    damaged(where + ": " + e.what());
  }
  return p;
}

json entry_json(const TuningEntry& e) {
  auto opt = [](const std::optional<double>& v) { return v ? json(*v) : json(nullptr); };
  return json{{"problem", problem_json(e.problem)},
              {"winner", e.winner},
              {"winner_ms", e.winner_ms},
              {"reference_ms", opt(e.reference_ms)},
              {"runner_up", e.runner_up},
              {"runner_up_ms", opt(e.runner_up_ms)},
              {"best_fused", e.best_fused},
              {"best_fused_ms", opt(e.best_fused_ms)},
              {"error", e.error},
              {"candidates", e.candidates},
              {"timestamp", e.timestamp}};
}

TuningEntry entry_from_json(const std::string& key, const json& j, TunedPass pass) {
  const std::string where =
      (pass == TunedPass::backward ? "backward entry '" : "entry '") + key + "'";
  if (!j.is_object()) damaged(where + " must be an object");
  TuningEntry e;
  e.problem = problem_from_json(field(j, "problem", where), where);
  if (e.problem.key() != key)
    damaged(fmt::format("{}: its problem's key is '{}'", where, e.problem.key()));
  if (pass == TunedPass::backward) {
    if (backward_entry_problem(e.problem).key() != key)
      damaged(
          fmt::format("{}: backward entries are filed under backward_entry_problem's key "
                      "(the default momentum)",
                      where));
    // A problem BackwardPlan refuses was never tuned. (A guard: the one refusal left,
    // synchronized statistics, has no field in a file, so its key already fails above.)
    if (const std::string why = backward_refusal(e.problem); !why.empty())
      damaged(fmt::format("{}: a problem the backward pass refuses ({})", where, why));
  }
  e.winner = get_string(j, "winner", where);
  check_candidate(e.winner, "winner", where, pass, true, false);
  e.winner_ms = get_positive(j, "winner_ms", where);
  e.reference_ms = get_optional_positive(j, "reference_ms", where);
  e.runner_up = get_string(j, "runner_up", where);
  check_candidate(e.runner_up, "runner_up", where, pass, true, true);
  e.runner_up_ms = get_optional_positive(j, "runner_up_ms", where);
  if (e.runner_up.empty() != !e.runner_up_ms)
    damaged(where + ": 'runner_up' and 'runner_up_ms' must be given together");
  e.best_fused = get_string(j, "best_fused", where);
  check_candidate(e.best_fused, "best_fused", where, pass, false, true);
  e.best_fused_ms = get_optional_positive(j, "best_fused_ms", where);
  if (e.best_fused.empty() != !e.best_fused_ms)
    damaged(where + ": 'best_fused' and 'best_fused_ms' must be given together");
  if (e.winner != kReferenceCandidate && e.best_fused != e.winner)
    damaged(where + ": a fused winner must also be 'best_fused'");
  if (e.winner == kReferenceCandidate && !e.reference_ms)
    damaged(where + ": the reference won but 'reference_ms' is null");
  if (pass == TunedPass::backward && e.reference_ms)
    damaged(where + ": a backward entry has no reference contender ('reference_ms' must be null)");
  e.error = get_double(field(j, "error", where), where + ": 'error'");
  if (e.error < 0) damaged(where + ": 'error' must not be negative");
  e.candidates = static_cast<int>(get_int(j, "candidates", where, 0, 1 << 20));
  e.timestamp = get_int(j, "timestamp", where, 0);
  return e;
}

json identity_json(const TuningIdentity& id) {
  return json{{"name", id.name},
              {"cc", id.cc},
              {"driver", id.driver},
              {"nvrtc", id.nvrtc},
              {"fusejit", id.fusejit}};
}

// Nesting depth of JSON text, strings skipped; -1 when it exceeds `limit`.
int nesting_depth(std::string_view text, int limit) {
  int depth = 0, worst = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    if (c == '[' || c == '{') worst = std::max(worst, ++depth);
    if (c == ']' || c == '}') --depth;
    if (worst > limit) return -1;
  }
  return worst;
}

// ---------------------------------------------------------------------------------------------
// Files

// Which file a cached table came from: another process's rename gives a new inode, an
// in-place edit a new size or mtime.
struct Stamp {
  bool exists = false;
  dev_t dev = 0;
  ino_t ino = 0;
  off_t size = 0;
  std::int64_t mtime_ns = 0;
  bool operator==(const Stamp&) const = default;
};

Stamp stamp_of(const struct stat& st) {
  Stamp s;
  s.exists = true;
  s.dev = st.st_dev;
  s.ino = st.st_ino;
  s.size = st.st_size;
  s.mtime_ns = std::int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  return s;
}

Stamp stamp_path(const fs::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  return stamp_of(st);
}

struct FileText {
  bool exists = false;
  Stamp stamp;
  std::string text;
  std::string error;  // could not read (not damage)
  bool too_large = false;
};

FileText read_text(const fs::path& path) {
  FileText out;
  FileRead f = read_regular_file(path, kMaxFileBytes);
  if (f.status == FileStatus::missing) return out;
  out.exists = true;
  out.stamp = stamp_of(f.st);
  switch (f.status) {
    case FileStatus::ok:
      out.text.assign(f.bytes.begin(), f.bytes.end());
      break;
    case FileStatus::too_large:
      out.too_large = true;
      break;
    case FileStatus::not_regular:
      out.error = "not a regular file (" + f.why + ")";
      break;
    default:
      out.error = f.why;
      break;
  }
  return out;
}

// Tuning results choose which kernel runs: read only from a directory no other user controls.
// One warning per directory and process.
bool trusted(const fs::path& dir) {
  bool exists = false;
  const std::string why = why_untrusted_directory(dir, &exists);
  if (why.empty()) return true;
  static std::mutex mu;
  static auto* warned = new std::set<std::string>();  // never destroyed: static-exit safety
  std::lock_guard<std::mutex> lock(mu);
  if (warned->insert(dir.string()).second)
    log()->warn(
        "tuning database directory {} is not trusted: {}; its results are not used and new "
        "ones are kept in memory only",
        dir.string(), why);
  return false;
}

std::string utc_now_text() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

// Renames the damaged file aside if it is still the file that was read (another process may
// have replaced it with a good one since). Returns where it went, or "" when it was not moved.
// `locked`: the caller holds the FileLock already (a second flock from this process on another
// descriptor would wait for itself).
std::string set_aside(const fs::path& path, const Stamp& read, bool locked, std::string* error) {
  std::optional<FileLock> lock;
  if (!locked) lock.emplace(path, modes_from_env().file);
  const Stamp now = stamp_path(path);
  if (!now.exists || now.dev != read.dev || now.ino != read.ino) return {};
  const std::string base = path.string() + ".damaged-" + utc_now_text();
  std::string target = base;
  for (int i = 1; fs::exists(fs::path(target)) && i < 1000; ++i)
    target = fmt::format("{}-{}", base, i);
  if (::rename(path.c_str(), target.c_str()) != 0) {
    *error = errno_text(errno);
    return {};
  }
  return target;
}

// The process-wide memory of each database file: loaded once, reloaded when its stamp changes.
struct Slot {
  bool loaded = false;
  Stamp stamp;
  std::shared_ptr<const TuningTable> table;
  // Entries this process measured but could not write; they still serve this process.
  std::map<std::pair<TunedPass, std::string>, TuningEntry> overlay;
  bool warned_unreadable = false, warned_unwritable = false;
};

std::mutex g_mu;
std::map<std::string, Slot>& slots() {
  static auto* s = new std::map<std::string, Slot>();  // never destroyed: static-exit safety
  return *s;
}

struct Loaded {
  std::shared_ptr<const TuningTable> table;
  Stamp stamp;  // of what was read (a set-aside file reads as missing)
  std::string unreadable;
};

// Reads and validates `path` for `identity`; damage is set aside with one warning.
Loaded load(const fs::path& path, const TuningIdentity& identity, bool locked) {
  Loaded out;
  auto empty = std::make_shared<TuningTable>();
  empty->identity = identity;
  out.table = empty;
  if (!trusted(path.parent_path())) {
    out.unreadable = "the directory is not trusted";
    return out;
  }
  FileText f = read_text(path);
  if (!f.exists) return out;
  out.stamp = f.stamp;
  if (!f.error.empty()) {
    out.unreadable = f.error;
    return out;
  }
  std::string problem;
  try {
    if (f.too_large) damaged(fmt::format("larger than {} bytes", kMaxFileBytes));
    auto table = std::make_shared<TuningTable>(parse_tuning_table(f.text));
    if (table->identity.fingerprint != identity.fingerprint)
      damaged(fmt::format("written for fingerprint '{}', expected '{}'",
                          table->identity.fingerprint, identity.fingerprint));
    out.table = std::move(table);
    return out;
  } catch (const Error& e) {  // damage; anything else (bad_alloc) is not the file's fault
    problem = e.what();
  }
  std::string error;
  const std::string aside = set_aside(path, f.stamp, locked, &error);
  if (!aside.empty()) {
    log()->warn("tuning database {} is damaged ({}); moved it to {} and starting empty",
                path.string(), problem, aside);
    out.stamp = {};
  } else if (!error.empty()) {
    log()->warn("tuning database {} is damaged ({}) and cannot be moved aside ({}); ignoring it",
                path.string(), problem, error);
  } else {
    // Replaced by another process since we read it: the next call reads the new file.
    out.stamp = {};
    out.stamp.exists = true;  // never equal to a real stamp (ino 0)
  }
  return out;
}

std::shared_ptr<const TuningTable> with_overlay(const Slot& slot) {
  if (slot.overlay.empty()) return slot.table;
  auto merged = std::make_shared<TuningTable>(*slot.table);
  for (const auto& [key, e] : slot.overlay) {
    auto& entries = merged->of(key.first);
    auto it = entries.find(key.second);
    if (it == entries.end() || it->second.timestamp <= e.timestamp) entries[key.second] = e;
  }
  return merged;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

TuningIdentity tuning_identity(const Device& d) {
  TuningIdentity id;
  id.fusejit = FUSEJIT_VERSION;
  id.nvrtc = nvrtc_version();
  // The same text fusejit has always written: GPU, then NVRTC, then fusejit.
  id.fingerprint = d.fingerprint() + "|nvrtc" + id.nvrtc + "|fusejit" + id.fusejit;
  id.name = d.name;
  id.cc = d.cc();
  id.driver = d.driver_version;
  return id;
}

bool same_bucket(const Problem& a, const Problem& b) {
  return a.dtype == b.dtype && a.param_dtype == b.param_dtype && a.mode == b.mode &&
         a.has_bias == b.has_bias && a.has_scale == b.has_scale && a.has_affine == b.has_affine &&
         a.effective_alignment() == b.effective_alignment();
}

double log2_distance(const Problem& a, const Problem& b) {
  auto d = [](std::int64_t x, std::int64_t y) {
    return std::abs(std::log2(static_cast<double>(x) / static_cast<double>(y)));
  };
  return d(a.M, b.M) + d(a.N, b.N) + d(a.K, b.K);
}

std::optional<BucketMatch> nearest_bucket(const TuningTable& table, const Problem& p) {
  const double radius = std::log2(kBucketMaxRatio) + 1e-9;
  std::optional<BucketMatch> best;
  for (const auto& [key, e] : table.entries) {
    const Problem& q = e.problem;
    if (!same_bucket(q, p)) continue;
    auto within = [&](std::int64_t x, std::int64_t y) {
      return std::abs(std::log2(static_cast<double>(x) / static_cast<double>(y))) <= radius;
    };
    if (!within(q.M, p.M) || !within(q.N, p.N) || !within(q.K, p.K)) continue;
    const double dist = log2_distance(q, p);
    // Entries iterate in key order, so a strict '<' keeps the smaller key among ties.
    if (!best || dist < best->distance - 1e-12) best = BucketMatch{&e, dist};
  }
  return best;
}

Problem backward_entry_problem(const Problem& p) {
  Problem q = p;
  q.momentum = Problem{}.momentum;
  return q;
}

const TuningEntry* same_m_class(const TuningTable& table, const Problem& p, TunedPass pass) {
  const MClass cls = m_class(p.M);
  const std::string key = p.key();
  const std::string_view layer = std::string_view(key).substr(key.find('x'));
  const TuningEntry* best = nullptr;
  double best_dist = 0;
  for (const auto& [k, e] : table.of(pass)) {
    const std::int64_t m = e.problem.M;
    if (k == key) continue;  // the exact entry is the dispatch's first step, not its second
    if (m < cls.lo || m > cls.hi || std::string_view(k).substr(k.find('x')) != layer) continue;
    const double dist = std::abs(std::log2(static_cast<double>(m) / static_cast<double>(p.M)));
    if (!best || dist < best_dist - 1e-12 || (dist < best_dist + 1e-12 && m < best->problem.M))
      best = &e, best_dist = dist;
  }
  return best;
}

std::string tuning_table_json(const TuningTable& t) {
  json entries = json::object(), backward = json::object();
  for (const auto& [key, e] : t.entries) entries[key] = entry_json(e);
  for (const auto& [key, e] : t.backward) backward[key] = entry_json(e);
  const json j{{"schema", kSchema},
               {"version", kVersion},
               {"fingerprint", t.identity.fingerprint},
               {"device", identity_json(t.identity)},
               {"entries", std::move(entries)},
               {"backward_entries", std::move(backward)}};
  return j.dump(2) + "\n";
}

TuningTable parse_tuning_table(std::string_view text) {
  if (nesting_depth(text, kMaxDepth) < 0)
    damaged(fmt::format("nested deeper than {} levels", kMaxDepth));
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    damaged(std::string("not JSON: ") + e.what());
  }
  if (!j.is_object()) damaged("not a JSON object");
  const std::string top = "file";
  if (get_string(j, "schema", top) != kSchema)
    damaged("schema is not '" + std::string(kSchema) + "'");
  const std::int64_t version = get_int(j, "version", top);
  if (version != 1 && version != kVersion)
    damaged(fmt::format("version {} (this fusejit reads versions 1 and {})", version, kVersion));
  TuningTable t;
  t.identity.fingerprint = get_string(j, "fingerprint", top);
  const json& dev = field(j, "device", top);
  if (!dev.is_object()) damaged("'device' must be an object");
  t.identity.name = get_string(dev, "name", "device");
  t.identity.cc = static_cast<int>(get_int(dev, "cc", "device", 10, 1000));
  t.identity.driver = static_cast<int>(get_int(dev, "driver", "device", 0, 1 << 30));
  t.identity.nvrtc = get_string(dev, "nvrtc", "device");
  t.identity.fusejit = get_string(dev, "fusejit", "device");
  const json& entries = field(j, "entries", top);
  if (!entries.is_object()) damaged("'entries' must be an object");
  for (const auto& [key, value] : entries.items())
    t.entries.emplace(key, entry_from_json(key, value, TunedPass::forward));
  // Version 1 predates backward tuning.
  if (const auto it = j.find("backward_entries"); it != j.end()) {
    if (version == 1) damaged("'backward_entries' in a version 1 file");
    if (!it->is_object()) damaged("'backward_entries' must be an object");
    for (const auto& [key, value] : it->items())
      t.backward.emplace(key, entry_from_json(key, value, TunedPass::backward));
  }
  return t;
}

// ---------------------------------------------------------------------------------------------

fs::path TuningDb::default_dir(const std::string& cache_dir) {
  return DiskCache::resolve_dir(cache_dir) / "tuning";
}

std::string TuningDb::file_name(const std::string& fingerprint) {
  std::string s;
  for (char c : fingerprint) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '-' || c == '_';
    const char out = ok ? c : '_';
    if (out == '_' && !s.empty() && s.back() == '_') continue;  // "a (b)" -> "a_b_"
    s += out;
  }
  // A leading '.' would hide the file (and our temp files start with one).
  while (!s.empty() && s.front() == '.') s.front() = '_';
  if (s.size() > 120) s.resize(120);
  return s + "-" + Hasher().add(fingerprint).hex().substr(0, 8) + ".json";
}

TuningDb::TuningDb(fs::path dir, TuningIdentity identity)
    : dir_(std::move(dir)), identity_(std::move(identity)) {
  path_ = dir_ / file_name(identity_.fingerprint);
}

TuningDb TuningDb::for_device(const Device& device, const std::string& cache_dir) {
  return TuningDb(default_dir(cache_dir), tuning_identity(device));
}

std::shared_ptr<const TuningTable> TuningDb::table() const {
  const std::string key = path_.string();
  const Stamp now = stamp_path(path_);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    Slot& slot = slots()[key];
    if (slot.loaded && slot.stamp == now) return with_overlay(slot);
  }
  // Loaded without g_mu: setting a damaged file aside takes the file lock, which record()
  // holds while it takes g_mu; two threads loading at once is merely redundant.
  Loaded l = load(path_, identity_, false);
  std::lock_guard<std::mutex> lock(g_mu);
  Slot& slot = slots()[key];
  if (!l.unreadable.empty()) {
    if (!std::exchange(slot.warned_unreadable, true))
      log()->warn("tuning database {} is unreadable ({}); tuning results will not be used", key,
                  l.unreadable);
  }
  slot.loaded = true;
  slot.stamp = l.stamp;
  slot.table = l.table;
  return with_overlay(slot);
}

std::optional<TuningEntry> TuningDb::find(const Problem& p, TunedPass pass) const {
  const auto t = table();
  auto it =
      t->of(pass).find(pass == TunedPass::backward ? backward_entry_problem(p).key() : p.key());
  if (it == t->of(pass).end()) return std::nullopt;
  return it->second;
}

bool TuningDb::record(const TuningEntry& e, TunedPass pass) const {
  // Refuse now what every later read would reject as damage.
  try {
    entry_from_json(e.problem.key(), entry_json(e), pass);
  } catch (const Error& err) {
    throw InvalidArgument("entry", err.what());
  }
  const std::string key = path_.string();
  std::string why;
  const FileModes modes = modes_from_env();
  why = create_directories(dir_, modes.dir);
  if (why.empty() && !trusted(dir_)) why = "the directory is not trusted";
  if (why.empty()) {
    FileLock lock(path_, modes.file);
    if (!lock.error().empty()) {
      why = lock.error();
    } else {
      // Re-read under the lock: another process may have recorded since we last looked.
      Loaded current = load(path_, identity_, true);
      TuningTable t = *current.table;
      t.identity = identity_;
      t.of(pass)[e.problem.key()] = e;
      // Writing over a file we could not read would drop every entry in it.
      const std::string text = tuning_table_json(t);
      why = current.unreadable.empty()
                ? write_file_atomically(path_, {std::span<const char>(text)}, modes.file)
                : "cannot read the current file: " + current.unreadable;
      if (why.empty()) {
        const Stamp written = stamp_path(path_);
        std::lock_guard<std::mutex> g(g_mu);
        Slot& slot = slots()[key];
        slot.loaded = true;
        slot.stamp = written;
        slot.table = std::make_shared<const TuningTable>(std::move(t));
        slot.overlay.erase({pass, e.problem.key()});
        return true;
      }
    }
  }
  std::lock_guard<std::mutex> g(g_mu);
  Slot& slot = slots()[key];
  slot.overlay[{pass, e.problem.key()}] = e;
  if (!std::exchange(slot.warned_unwritable, true))
    log()->warn(
        "cannot write tuning database {} ({}); this process keeps its tuning results in "
        "memory only. Set FUSEJIT_CACHE_DIR to a writable directory to keep them.",
        key, why);
  else
    log()->debug("cannot write tuning database {} ({})", key, why);
  return false;
}

TuningTable read_tuning_file(const fs::path& path) {
  FileText f = read_text(path);
  if (!f.exists) throw Error(fmt::format("tuning database {}: no such file", path.string()));
  if (!f.error.empty()) throw Error(fmt::format("tuning database {}: {}", path.string(), f.error));
  try {
    if (f.too_large) damaged(fmt::format("larger than {} bytes", kMaxFileBytes));
    return parse_tuning_table(f.text);
  } catch (const Error& e) {
    throw Error(fmt::format("tuning database {} is damaged: {}", path.string(), e.what()));
  }
}

}  // namespace fusejit
