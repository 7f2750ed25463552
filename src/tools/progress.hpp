// Progress display for `fusejit autotune`: a bar with an ETA redrawn in place on a terminal,
// plain lines (one per stage) when the output is a file or a pipe, so logs stay readable.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <string>

#include "fusejit/tune/tuner.hpp"

namespace fusejit {

// How far one tune is, 0..1. Compiling is weighted most (NVRTC dominates), then timing, then
// verification.
double tune_fraction(const TuneProgress& p);
// "7s", "1m05s", "2h03m".
std::string format_duration(double seconds);
// "[#####-----]" with `width` cells between the brackets.
std::string render_bar(double fraction, int width);
// Remaining seconds at a constant rate, or a negative value when too little is done to say.
double eta_seconds(double elapsed_seconds, double fraction);

class TuneProgressBar {
 public:
  // `interactive`: redraw one line in place (a terminal); else print plain lines.
  // `columns`: the line width on a terminal (0: ask the terminal, else 100).
  TuneProgressBar(std::FILE* out, std::size_t problems, bool interactive, int columns = 0);
  // Problem `index` (0-based) named `label` starts.
  void start(std::size_t index, const std::string& label);
  void update(const TuneProgress& p);
  // The current problem is done: `line` stays on screen above the bar.
  void finish(const std::string& line);
  // Clears the bar (interactive) before the summary is printed.
  void close();

 private:
  void draw(bool force);

  std::FILE* out_;
  std::size_t problems_;
  bool interactive_;
  int columns_;
  std::chrono::steady_clock::time_point start_, last_draw_;
  std::size_t index_ = 0;
  std::string label_;
  TuneProgress current_;
  bool started_stage_[4] = {false, false, false, false};
  bool drawn_ = false;
};

}  // namespace fusejit
