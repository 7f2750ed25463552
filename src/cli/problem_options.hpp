// Options that describe problems on the command line, shared by compile, bench and check.
#pragma once
#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "fusejit/problem.hpp"

namespace fusejit::cli {

struct ProblemOptions {
  std::string shapes = "1024x8192x8192";
  std::string dtypes = "bf16";
  std::string modes = "train";
  std::string param_dtype = "fp32";
  std::string momentum = "0.1";  // or "none"
  double eps = 1e-5;
  // Train problems only (eval keeps 0). Only `fusejit compile` offers it (--stat-ranks): the
  // commands that run kernels have no communicator to synchronize over.
  int stat_ranks = 0;

  void add_to(CLI::App& cmd, bool lists);
  // Every (shape, dtype, mode) combination. Throws InvalidArgument on a bad spelling.
  std::vector<Problem> problems() const;
};

std::vector<std::string> split_list(const std::string& text);

}  // namespace fusejit::cli
