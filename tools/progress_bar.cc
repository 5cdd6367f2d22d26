#include "tools/progress_bar.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace remat::sim {

ProgressBar ProgressBar::ForStderr() { return ProgressBar(stderr, ::isatty(STDERR_FILENO) == 1); }

std::string ProgressBar::Frame(std::size_t done, std::size_t total, std::string_view label, std::size_t width) {
  const std::size_t filled = total == 0 ? width : std::min(width, done * width / total);
  std::string bar(filled, '#');
  bar.append(width - filled, '.');
  return absl::StrCat("[", bar, "] ", done, "/", total, "  ", absl::string_view(label.data(), label.size()));
}

void ProgressBar::Update(std::size_t done, std::size_t total, std::string_view label) {
  if (!enabled_) return;
  std::string frame = Frame(done, total, label);
  const std::size_t length = frame.size();
  if (length < last_length_) frame.append(last_length_ - length, ' ');  // erase the longer previous frame
  std::fprintf(stream_, "\r%s", frame.c_str());
  std::fflush(stream_);
  last_length_ = length;
}

void ProgressBar::Finish() {
  if (!enabled_ || last_length_ == 0) return;
  std::fprintf(stream_, "\r%s\r", std::string(last_length_, ' ').c_str());
  std::fflush(stream_);
  last_length_ = 0;
}

}  // namespace remat::sim
