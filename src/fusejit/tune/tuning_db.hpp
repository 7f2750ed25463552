// The tuning database: what the autotuner measured, one JSON file per GPU fingerprint under
// <cache dir>/tuning/, so the next Plan on the same GPU runs the fastest verified kernel without
// measuring again.
//
// File <cache dir>/tuning/<sanitized fingerprint>-<8 hex of its hash>.json:
//
//   {"schema": "fusejit-tuning-db", "version": 1,
//    "fingerprint": "<GPU name>|cc90|driver13000|nvrtc13.0|fusejit0.1.0",
//    "device": {"name": ..., "cc": 90, "driver": 13000, "nvrtc": "13.0", "fusejit": "0.1.0"},
//    "entries": {"<Problem::key()>": {
//        "problem": {"M", "N", "K", "dtype", "param_dtype", "mode", "eps", "momentum" (null:
//                    cumulative), "bias", "scale", "affine", "ldx", "ldw", "ldy", "alignment"},
//        "winner": "<KernelConfig::key()>" | "reference",  "winner_ms": 0.71,
//        "reference_ms": 0.93 | null,                      (the cuBLASLt contender)
//        "runner_up": "<key>" | "reference" | "",          "runner_up_ms": ... | null,
//        "best_fused": "<key>" | "",                        "best_fused_ms": ... | null,
//        "error": 1.2e-3, "candidates": 12, "timestamp": <unix seconds>}},
//    "backward_entries": {"<Problem::key()>": {... the same fields; "winner", "runner_up" and
//        "best_fused" are BackwardConfig keys (dx.<key>.dw.<key>), "reference_ms" is null}}}
//
// "backward_entries" holds what `fusejit autotune --backward` measured for BackwardPlan; a file
// written before it existed has none, and reads as having none.
//
// Writes are read-modify-write under an exclusive flock on <file>.lock, through a temp file in
// the same directory that is fsynced and renamed over the file: readers (which take no lock)
// see the old file or the new one, whole. Every read validates the whole file; a file that
// does not parse or does not follow the schema is renamed aside to <file>.damaged-<UTC time>
// with one warning and reads as empty: its contents are never trusted.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fusejit/device.hpp"
#include "fusejit/problem.hpp"

namespace fusejit {

// The winner name of the cuBLASLt reference contender (ReferenceOp).
inline constexpr std::string_view kReferenceCandidate = "reference";

// What a tuning result depends on: Device::fingerprint() (GPU name, CC, driver), NVRTC's version
// plus
// the fusejit version (a new release may change every kernel).
struct TuningIdentity {
  std::string fingerprint;
  std::string name;
  int cc = 0;
  int driver = 0;
  std::string nvrtc;
  std::string fusejit;
};
TuningIdentity tuning_identity(const Device& device);

// Which plan an entry tunes: Plan's kernels, or BackwardPlan's gradient GEMMs.
enum class TunedPass { forward, backward };

struct TuningEntry {
  Problem problem;                     // exactly what was tuned; problem.key() names the entry
  std::string winner;                  // KernelConfig::key() or kReferenceCandidate
  double winner_ms = 0;                // median time of the winner
  std::optional<double> reference_ms;  // the cuBLASLt contender (none: it could not run)
  std::string runner_up;               // next fastest candidate ("" when none)
  std::optional<double> runner_up_ms;
  // The fastest fused config that passed verification: the winner unless the reference won
  // ("" when no fused config passed). A Plan whose winner is the reference reports it.
  std::string best_fused;
  std::optional<double> best_fused_ms;
  double error = 0;            // the winner's worst relative error against float64
  int candidates = 0;          // candidates considered
  std::int64_t timestamp = 0;  // unix seconds when it was measured
};

// The contents of one database file.
struct TuningTable {
  TuningIdentity identity;
  std::map<std::string, TuningEntry> entries;   // by Problem::key()
  std::map<std::string, TuningEntry> backward;  // by Problem::key(): BackwardPlan's
  const std::map<std::string, TuningEntry>& of(TunedPass pass) const {
    return pass == TunedPass::backward ? backward : entries;
  }
  std::map<std::string, TuningEntry>& of(TunedPass pass) {
    return pass == TunedPass::backward ? backward : entries;
  }
};

// Nearest-bucket rule for problems never tuned. A tuned entry is a neighbour of `p` when it has
// the same dtype, param dtype, mode, bias/scale/affine presence and effective alignment, and
// each of M, N and K lies within a factor kBucketMaxRatio of p's. Among neighbours the nearest
// by sum over M, N, K of |log2(tuned / wanted)| wins (ties: the smaller key). Whether its winner
// may run `p` is the caller's check (dispatch: KernelConfig::valid_for, else the heuristic).
inline constexpr double kBucketMaxRatio = 4.0;
bool same_bucket(const Problem& a, const Problem& b);
double log2_distance(const Problem& a, const Problem& b);  // sum of |log2 ratio| of M, N, K
struct BucketMatch {
  const TuningEntry* entry = nullptr;
  double distance = 0;
};
std::optional<BucketMatch> nearest_bucket(const TuningTable& table, const Problem& p);
// The problem a backward entry is filed under: p with the default momentum. The backward pass
// never reads the running stats' momentum, so one tuning serves the layer whatever its momentum
// (momentum=None included); a backward entry filed under another momentum is damage.
Problem backward_entry_problem(const Problem& p);

// The entry of p's layer (every field but M equal) whose M lies in p's M class (m_class), the
// nearest M by |log2 ratio| first (ties: the smaller M), never p's own entry (so an exact entry
// the dispatch could not use does not hide a usable one of the class); null when there is none.
const TuningEntry* same_m_class(const TuningTable& table, const Problem& p,
                                TunedPass pass = TunedPass::forward);

// The file's JSON text (entries in key order) and its strict inverse: parse_tuning_table
// throws Error naming what is wrong (not JSON, schema, version, a field, an entry whose key is
// not its problem's key...).
std::string tuning_table_json(const TuningTable& table);
TuningTable parse_tuning_table(std::string_view text);

class TuningDb {
 public:
  // <cache_dir or DiskCache::default_dir()>/tuning
  static std::filesystem::path default_dir(const std::string& cache_dir = {});
  // "<fingerprint with every byte outside [A-Za-z0-9._-] as '_'>-<8 hex of its hash>.json":
  // readable, and distinct fingerprints never share a file.
  static std::string file_name(const std::string& fingerprint);

  TuningDb(std::filesystem::path dir, TuningIdentity identity);
  // The database of `device` under `cache_dir` (empty: the default cache directory).
  static TuningDb for_device(const Device& device, const std::string& cache_dir = {});

  const std::filesystem::path& path() const { return path_; }
  const TuningIdentity& identity() const { return identity_; }

  // The file's contents now. Loaded once per process and kept in memory; a stat() per call
  // notices another writer (inode, size or mtime changed) and reloads. Missing file: empty.
  // Damaged or another fingerprint's file: set aside (one warning), empty. Never throws for
  // file trouble (an unreadable file reads as empty after a warning).
  std::shared_ptr<const TuningTable> table() const;
  std::optional<TuningEntry> find(const Problem& p, TunedPass pass = TunedPass::forward) const;

  // Adds or replaces the entry for e.problem.key() of `pass`. False (with one warning) when the
  // file cannot be written; the entry then still serves this process (an in-memory overlay).
  bool record(const TuningEntry& e, TunedPass pass = TunedPass::forward) const;

 private:
  std::filesystem::path dir_, path_;
  TuningIdentity identity_;
};

// Reads and validates one database file for `fusejit compile --from-db` (any fingerprint).
// Throws Error naming the file and the damage; never sets the file aside.
TuningTable read_tuning_file(const std::filesystem::path& path);

}  // namespace fusejit
