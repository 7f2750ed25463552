#include "cli/problem_options.hpp"

#include <cstdlib>

#include "fusejit/error.hpp"

namespace fusejit::cli {

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const auto comma = text.find(',', start);
    const auto part =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!part.empty()) out.push_back(part);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

void ProblemOptions::add_to(CLI::App& cmd, bool lists) {
  const char* s = lists ? "Shapes MxNxK, comma-separated" : "Shape MxNxK (x is MxK, W is NxK)";
  cmd.add_option(lists ? "--shapes,--shape" : "--shape", shapes, s)->capture_default_str();
  cmd.add_option(lists ? "--dtypes,--dtype" : "--dtype", dtypes, "fp32, tf32, fp16, bf16 or tf32x3")
      ->capture_default_str();
  cmd.add_option(lists ? "--modes,--mode" : "--mode", modes, "train or eval")
      ->capture_default_str();
  cmd.add_option("--param-dtype", param_dtype, "Parameter storage: fp32 or the input's type")
      ->capture_default_str();
  cmd.add_option("--momentum", momentum, "BatchNorm momentum, or none (cumulative)")
      ->capture_default_str();
  cmd.add_option("--eps", eps, "BatchNorm eps")->capture_default_str();
}

std::vector<Problem> ProblemOptions::problems() const {
  std::vector<Problem> out;
  std::optional<double> mom;
  if (momentum != "none") {
    char* end = nullptr;
    const double m = std::strtod(momentum.c_str(), &end);
    if (momentum.empty() || *end != '\0')
      throw InvalidArgument("momentum",
                            "expected a number in [0, 1] or 'none'; got '" + momentum + "'");
    mom = m;
  }
  for (const auto& s : split_list(shapes)) {
    const Shape shape = parse_shape(s);
    for (const auto& d : split_list(dtypes)) {
      for (const auto& m : split_list(modes)) {
        Problem p;
        p.M = shape.M, p.N = shape.N, p.K = shape.K;
        p.dtype = parse_dtype(d);
        p.mode = parse_mode(m);
        p.param_dtype = param_dtype == "same" ? storage_type(p.dtype) : parse_dtype(param_dtype);
        p.momentum = mom;
        p.eps = eps;
        if (p.mode == Mode::train) p.stat_ranks = stat_ranks;
        p.validate();
        out.push_back(p);
      }
    }
  }
  if (out.empty()) throw InvalidArgument("shape", "no problem given");
  return out;
}

}  // namespace fusejit::cli
