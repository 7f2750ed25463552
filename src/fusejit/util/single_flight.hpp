// Concurrent callers asking for the same key share one computation: the first runs it, the
// others wait for its value or its exception. Plans (one compile per kernel set) and the tuner
// (one measurement per problem) both need exactly this, so it lives here once.
#pragma once
#include <exception>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace fusejit {

template <class Value>
class SingleFlight {
 public:
  // What happens to a finished flight: kept (later calls get its value without running again:
  // an in-process cache) or forgotten (later calls run again: deduplication only). A flight
  // that threw is always forgotten, so a transient failure is retried.
  enum class Keep { values, nothing };
  explicit SingleFlight(Keep keep) : keep_(keep) {}

  // The value for `key`: a kept one, the one in flight, or compute()'s.
  template <class Compute>
  Value get(const std::string& key, Compute&& compute) {
    std::promise<Value> mine;
    std::shared_future<Value> flight;
    bool run = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = flights_.find(key);
      if (it != flights_.end()) {
        flight = it->second;
      } else {
        flight = mine.get_future().share();
        flights_.emplace(key, flight);
        run = true;
      }
    }
    if (run) {
      bool failed = false;
      try {
        mine.set_value(std::forward<Compute>(compute)());
      } catch (...) {
        failed = true;
        mine.set_exception(std::current_exception());
      }
      if (failed || keep_ == Keep::nothing) {
        std::lock_guard<std::mutex> lock(mu_);
        flights_.erase(key);
      }
    }
    return flight.get();
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::shared_future<Value>> flights_;
  Keep keep_;
};

}  // namespace fusejit
