// SingleFlight: concurrent callers of one key run one computation and share its value; a
// failure is shared by those waiting on it and then forgotten; Keep::nothing forgets values too.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "fusejit/util/single_flight.hpp"

using fusejit::SingleFlight;

TEST_CASE("16 threads asking for one key run the computation once and all get its value") {
  SingleFlight<int> flights(SingleFlight<int>::Keep::values);
  std::atomic<int> runs{0}, wrong{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&] {
      while (!go.load()) std::this_thread::yield();
      const int v = flights.get("k", [&] {
        ++runs;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));  // others arrive meanwhile
        return 42;
      });
      if (v != 42) ++wrong;
    });
  }
  go = true;
  for (auto& t : threads) t.join();
  CHECK(runs.load() == 1);
  CHECK(wrong.load() == 0);
  // Kept: a later call does not run again; another key does.
  CHECK(flights.get("k", [&] { return ++runs, 7; }) == 42);
  CHECK(flights.get("other", [&] { return ++runs, 7; }) == 7);
  CHECK(runs.load() == 2);
}

TEST_CASE("a failed computation is forgotten, so the next call tries again") {
  SingleFlight<std::string> flights(SingleFlight<std::string>::Keep::values);
  CHECK_THROWS_AS(flights.get("k", []() -> std::string { throw std::runtime_error("transient"); }),
                  std::runtime_error);
  CHECK(flights.get("k", [] { return std::string("ok"); }) == "ok");
}

TEST_CASE("Keep::nothing deduplicates concurrent calls only") {
  SingleFlight<int> flights(SingleFlight<int>::Keep::nothing);
  int runs = 0;
  CHECK(flights.get("k", [&] { return ++runs; }) == 1);
  CHECK(flights.get("k", [&] { return ++runs; }) == 2);
}
