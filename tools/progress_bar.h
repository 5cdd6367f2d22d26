// ProgressBar: a one-line "[#####.....] 12/45  label" on a terminal stream, redrawn in place.
//
// Contract: when disabled (the default for a stream that is not a terminal: see ForStderr) it writes nothing at
// all, so redirected stderr stays clean. When enabled, Update redraws the line with '\r' and Finish erases it,
// leaving the cursor at the start of an empty line. Not thread-safe: the caller serializes calls (SimRunner's
// on_done callback already is).
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>

namespace remat::sim {

class ProgressBar {
 public:
  ProgressBar(std::FILE* stream, bool enabled) : stream_(stream), enabled_(enabled) {}
  // Enabled exactly when stderr is a terminal (isatty).
  static ProgressBar ForStderr();

  bool enabled() const { return enabled_; }
  void Update(std::size_t done, std::size_t total, std::string_view label);
  void Finish();

  // The text of one frame without the leading '\r' (exposed for tests); `width` is the bar's cell count.
  static std::string Frame(std::size_t done, std::size_t total, std::string_view label, std::size_t width = 30);

 private:
  std::FILE* stream_;
  bool enabled_;
  std::size_t last_length_ = 0;
};

}  // namespace remat::sim
