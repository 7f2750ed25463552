// parse_tuning_table (the tuning database's JSON files, which other processes and people edit):
// any text is a table or a fusejit::Error; no nlohmann or standard-library exception escapes.
// What it accepts is what the rest of fusejit relies on: every entry's key is its problem's
// key and the problem is valid; and the format is a fixed point: tuning_table_json of the table
// parses back to a table with exactly the same JSON text.
#include <cstdint>
#include <exception>
#include <string>

#include "fusejit/error.hpp"
#include "fusejit/plan/backward_core.hpp"
#include "fusejit/tune/tuning_db.hpp"
#include "fuzz_check.hpp"

namespace {

fusejit::TuningTable parse_or_reject(const std::string& text, bool* ok) {
  *ok = false;
  try {
    fusejit::TuningTable t = fusejit::parse_tuning_table(text);
    *ok = true;
    return t;
  } catch (const fusejit::Error&) {
    return {};
  } catch (const std::exception& e) {
    FJ_FUZZ_CHECK(false, "a non-fusejit exception escaped: %s", e.what());
  }
  return {};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  bool ok = false;
  const fusejit::TuningTable t = parse_or_reject(fusejit::fuzz::as_string(data, size), &ok);
  if (!ok) return 0;
  for (const auto* map : {&t.entries, &t.backward}) {
    for (const auto& [key, e] : *map) {
      FJ_FUZZ_CHECK(key == e.problem.key(), "entry '%s' holds problem '%s'", key.c_str(),
                    e.problem.key().c_str());
      try {
        e.problem.validate();
      } catch (const fusejit::InvalidArgument& ex) {
        FJ_FUZZ_CHECK(false, "entry '%s' holds an invalid problem: %s", key.c_str(), ex.what());
      }
    }
  }
  for (const auto& [key, e] : t.backward) {
    const std::string why = fusejit::backward_refusal(e.problem);
    FJ_FUZZ_CHECK(why.empty(), "backward entry '%s' holds a problem the backward pass refuses: %s",
                  key.c_str(), why.c_str());
  }
  const std::string text = fusejit::tuning_table_json(t);
  bool again_ok = false;
  const fusejit::TuningTable again = parse_or_reject(text, &again_ok);
  FJ_FUZZ_CHECK(again_ok, "the JSON of an accepted table does not parse:\n%s", text.c_str());
  FJ_FUZZ_CHECK(
      again.entries.size() == t.entries.size() && again.backward.size() == t.backward.size(),
      "entries lost in the round trip");
  FJ_FUZZ_CHECK(fusejit::tuning_table_json(again) == text, "the JSON is not a fixed point:\n%s",
                text.c_str());
  return 0;
}
