#include "fusejit/compile/ptxas_report.hpp"

#include <fmt/format.h>

#include <regex>
#include <sstream>

namespace fusejit {

namespace {

FunctionResources& function_named(std::vector<FunctionResources>& out, const std::string& name) {
  for (auto& f : out)
    if (f.name == name) return f;
  out.push_back({});
  out.back().name = name;
  return out.back();
}

}  // namespace

PtxasReport read_ptxas_report(const std::string& log) {
  // ptxas info    : 0 bytes gmem
  // ptxas info    : Compiling entry function 'fj_gemm' for 'sm_90a'
  // ptxas info    : Function properties for fj_gemm
  // ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
  // ptxas info    : Used 168 registers, used 1 barriers, 16 bytes cmem[0]
  // ptxas info    : Compile time = 1.5 ms
  // Only these are the report: ptxas says other things as "ptxas info" too, such as its (C7514)
  // warning that wgmma instructions were serialized, which stay in `rest`.
  static const std::regex entry(R"re(^ptxas info +: Compiling entry function '([^']+)')re");
  static const std::regex properties(R"re(^ptxas info +: Function properties for (\S+))re");
  static const std::regex frame(
      R"re(^ptxas +\. +(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads)re");
  static const std::regex used(R"re(^ptxas info +: Used (\d+) registers)re");
  static const std::regex report_only(R"re(^ptxas info +: (\d+ bytes gmem|Compile time = ))re");
  PtxasReport out;
  std::string current_entry;  // the entry function whose "Used" line comes next
  std::string properties_of;  // the function the next frame line belongs to
  std::istringstream in(log);
  std::smatch m;
  for (std::string line; std::getline(in, line);) {
    if (std::regex_search(line, m, entry)) {
      current_entry = m[1];
      function_named(out.functions, current_entry).entry = true;
    } else if (std::regex_search(line, m, properties)) {
      properties_of = m[1];
      function_named(out.functions, properties_of);
    } else if (std::regex_search(line, m, frame) && !properties_of.empty()) {
      FunctionResources& f = function_named(out.functions, properties_of);
      f.stack_frame_bytes = std::stoll(m[1]);
      f.spill_store_bytes = std::stoll(m[2]);
      f.spill_load_bytes = std::stoll(m[3]);
      properties_of.clear();
    } else if (std::regex_search(line, m, used) && !current_entry.empty()) {
      function_named(out.functions, current_entry).registers = std::stoi(m[1]);
      current_entry.clear();
    } else if (!std::regex_search(line, report_only)) {
      out.rest += (out.rest.empty() ? "" : "\n") + line;
    }
  }
  return out;
}

std::string describe_spills(const std::vector<FunctionResources>& functions) {
  std::string out;
  for (const auto& f : functions)
    if (f.spills())
      out += fmt::format("{}{} {} B stored / {} B loaded", out.empty() ? "" : ", ", f.name,
                         f.spill_store_bytes, f.spill_load_bytes);
  return out;
}

}  // namespace fusejit
