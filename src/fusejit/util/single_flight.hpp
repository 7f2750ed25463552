// Concurrent callers asking for the same key share one computation: the first runs it, the
// others wait for its value or its exception. Plans (one compile per kernel set) and the tuner
// (one measurement per problem) both need exactly this, so it lives here once.
#pragma once
#include <cstddef>
#include <exception>
#include <future>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace fusejit {

template <class Value>
class SingleFlight {
 public:
  // What happens to a finished flight: kept (later calls get its value without running again:
  // an in-process cache) or forgotten (later calls run again: deduplication only). A flight
  // that threw is always forgotten, so a transient failure is retried.
  enum class Keep { values, nothing };
  // With Keep::values and a nonzero `capacity`, at most that many finished values are kept:
  // past it the least recently used go (a long-running process planning ever new shapes must
  // not grow without bound). 0 keeps every value. Flights in progress are never dropped:
  // their callers are waiting on them.
  explicit SingleFlight(Keep keep, std::size_t capacity = 0) : keep_(keep), capacity_(capacity) {}

  // The value for `key`: a kept one, the one in flight, or compute()'s; `computed` (when given)
  // says whether this call ran compute().
  template <class Compute>
  Value get(const std::string& key, Compute&& compute, bool* computed = nullptr) {
    std::promise<Value> mine;
    std::shared_future<Value> flight;
    typename Flights::iterator slot;
    bool run = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = flights_.find(key);
      if (it != flights_.end()) {
        flight = it->second.future;
        // A hit moves its node to the front: no allocation, O(1) after the O(log n) find.
        if (it->second.finished) recency_.splice(recency_.begin(), recency_, it->second.recency);
      } else {
        flight = mine.get_future().share();
        slot = flights_.emplace(key, Flight{flight, false, {}}).first;
        run = true;
      }
    }
    if (computed) *computed = run;
    if (run) {
      bool failed = false;
      try {
        mine.set_value(std::forward<Compute>(compute)());
      } catch (...) {
        failed = true;
        mine.set_exception(std::current_exception());
      }
      // Evicted values are destroyed after the lock is released: a value's destructor may be
      // slow (unloading a module) and must not stall every other caller.
      std::vector<typename Flights::node_type> dropped;
      {
        std::lock_guard<std::mutex> lock(mu_);
        // `slot` is still ours: only its runner erases a flight in progress.
        if (failed || keep_ == Keep::nothing) {
          flights_.erase(slot);
        } else {
          recency_.push_front(&slot->first);
          slot->second.finished = true;
          slot->second.recency = recency_.begin();
          evict_locked(dropped);
        }
      }
    }
    return flight.get();
  }

  // Applies at once (dropping what no longer fits) and to every later value; 0: unbounded.
  void set_capacity(std::size_t capacity) {
    std::vector<typename Flights::node_type> dropped;
    std::lock_guard<std::mutex> lock(mu_);
    capacity_ = capacity;
    evict_locked(dropped);
  }
  std::size_t capacity() const {
    std::lock_guard<std::mutex> lock(mu_);
    return capacity_;
  }
  // Values kept plus flights in progress.
  std::size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return flights_.size();
  }

 private:
  struct Flight;
  using Flights = std::map<std::string, Flight>;
  struct Flight {
    std::shared_future<Value> future;
    bool finished = false;
    // Its place in recency_ once finished. The list holds pointers to the map's keys, which
    // std::map never moves, so neither side needs a second copy of the key.
    typename std::list<const std::string*>::iterator recency;
  };

  // Moves the least recently used finished flights past capacity_ into `dropped`.
  void evict_locked(std::vector<typename Flights::node_type>& dropped) {
    if (capacity_ == 0) return;
    while (recency_.size() > capacity_) {
      auto it = flights_.find(*recency_.back());
      recency_.pop_back();
      dropped.push_back(flights_.extract(it));
    }
  }

  mutable std::mutex mu_;
  Flights flights_;
  std::list<const std::string*> recency_;  // finished flights, most recently used first
  Keep keep_;
  std::size_t capacity_;
};

}  // namespace fusejit
