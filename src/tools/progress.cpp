#include "tools/progress.hpp"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

namespace fusejit {

namespace {

std::string_view stage_name(TuneProgress::Stage s) {
  switch (s) {
    case TuneProgress::Stage::compiling:
      return "compiling";
    case TuneProgress::Stage::timing:
      return "timing";
    case TuneProgress::Stage::verifying:
      return "verifying";
    case TuneProgress::Stage::done:
      return "done";
  }
  return "?";
}

int terminal_columns(std::FILE* out) {
  winsize ws{};
  if (::ioctl(::fileno(out), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 20) return ws.ws_col;
  if (const char* env = std::getenv("COLUMNS")) {
    const int c = std::atoi(env);
    if (c > 20) return c;
  }
  return 100;
}

}  // namespace

double tune_fraction(const TuneProgress& p) {
  const double part =
      p.total ? std::clamp(static_cast<double>(p.done) / static_cast<double>(p.total), 0.0, 1.0)
              : 0.0;
  switch (p.stage) {
    case TuneProgress::Stage::compiling:
      return 0.6 * part;
    case TuneProgress::Stage::timing:
      return 0.6 + 0.3 * part;
    case TuneProgress::Stage::verifying:
      return 0.9 + 0.1 * part;
    case TuneProgress::Stage::done:
      return 1.0;
  }
  return 0;
}

std::string format_duration(double seconds) {
  const auto s = static_cast<long long>(std::llround(std::max(0.0, seconds)));
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}h{:02}m", s / 3600, s % 3600 / 60);
}

std::string render_bar(double fraction, int width) {
  width = std::max(width, 1);
  const int filled =
      static_cast<int>(std::floor(std::clamp(fraction, 0.0, 1.0) * static_cast<double>(width)));
  return "[" + std::string(static_cast<std::size_t>(filled), '#') +
         std::string(static_cast<std::size_t>(width - filled), '-') + "]";
}

double eta_seconds(double elapsed, double fraction) {
  // Below 2 % the rate says more about start-up than about the work left.
  if (fraction < 0.02 || elapsed <= 0) return -1;
  return elapsed * (1.0 - std::min(fraction, 1.0)) / fraction;
}

TuneProgressBar::TuneProgressBar(std::FILE* out, std::size_t problems, bool interactive,
                                 int columns)
    : out_(out),
      problems_(std::max<std::size_t>(problems, 1)),
      interactive_(interactive),
      columns_(columns > 0 ? columns : (interactive ? terminal_columns(out) : 100)),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

void TuneProgressBar::start(std::size_t index, const std::string& label) {
  index_ = index;
  label_ = label;
  current_ = TuneProgress{};
  std::fill(std::begin(started_stage_), std::end(started_stage_), false);
  // Plain output waits for the first update, which knows how many candidates there are.
  if (interactive_) draw(true);
}

void TuneProgressBar::update(const TuneProgress& p) {
  current_ = p;
  const auto stage = static_cast<std::size_t>(p.stage);
  const bool new_stage = !started_stage_[stage];
  started_stage_[stage] = true;
  if (interactive_) {
    draw(new_stage);
    return;
  }
  // Plain output: one line as each stage begins (the done line comes from finish()).
  if (new_stage && p.stage != TuneProgress::Stage::done) {
    fmt::print(out_, "[{}/{}] {}: {}{}\n", index_ + 1, problems_, label_, stage_name(p.stage),
               p.stage == TuneProgress::Stage::compiling && p.total
                   ? fmt::format(" {} candidates", p.total)
                   : std::string());
    std::fflush(out_);
  }
}

void TuneProgressBar::draw(bool force) {
  const auto now = std::chrono::steady_clock::now();
  // Redrawing faster than the eye reads only costs terminal time.
  if (!force && drawn_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double fraction =
      (static_cast<double>(index_) + tune_fraction(current_)) / static_cast<double>(problems_);
  const double eta = eta_seconds(elapsed, fraction);
  std::string detail = fmt::format("{}: {}", label_, stage_name(current_.stage));
  if (current_.total) detail += fmt::format(" {}/{}", current_.done, current_.total);
  if (!current_.candidate.empty()) detail += " " + current_.candidate;
  std::string line =
      fmt::format("{} {:3.0f}% {}/{} ETA {} ", render_bar(fraction, 24), 100.0 * fraction,
                  index_ + 1, problems_, eta < 0 ? std::string("--") : format_duration(eta)) +
      detail;
  const auto width = static_cast<std::size_t>(std::max(columns_ - 1, 20));
  if (line.size() > width) line.resize(width);
  // \r and "erase to end of line": the bar rewrites itself in place.
  fmt::print(out_, "\r\x1b[K{}", line);
  std::fflush(out_);
  drawn_ = true;
}

void TuneProgressBar::finish(const std::string& line) {
  if (interactive_ && drawn_) fmt::print(out_, "\r\x1b[K");
  fmt::print(out_, "[{}/{}] {}\n", index_ + 1, problems_, line);
  std::fflush(out_);
  drawn_ = false;
}

void TuneProgressBar::close() {
  if (interactive_ && drawn_) {
    fmt::print(out_, "\r\x1b[K");
    std::fflush(out_);
  }
  drawn_ = false;
}

}  // namespace fusejit
