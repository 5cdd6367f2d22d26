// Replay: the simulated executor and the driver that feeds a Trace through the engine.
#include "runtime/replay.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace remat {

std::string_view ToString(ReplayStatus status) {
  switch (status) {
    case ReplayStatus::kPass: return "pass";
    case ReplayStatus::kOom: return "oom";
    case ReplayStatus::kThrash: return "thrash";
    case ReplayStatus::kError: return "error";
  }
  return "error";
}

std::string_view ToString(AccountingMode mode) {
  return mode == AccountingMode::kCounter ? "counter" : "arena";
}

absl::StatusOr<AccountingMode> ParseAccountingMode(std::string_view text) {
  if (text == "counter") return AccountingMode::kCounter;
  if (text == "arena") return AccountingMode::kArena;
  return absl::InvalidArgumentError(absl::StrCat("unknown accounting mode '", std::string(text), "' (counter|arena)"));
}

struct Replayer::Impl {
  Baseline baseline;
};

Replayer::Replayer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Replayer::~Replayer() = default;

absl::StatusOr<std::unique_ptr<Replayer>> Replayer::Create(const Trace& trace) {
  return absl::UnimplementedError("Replayer: not implemented yet");
}

const Baseline& Replayer::baseline() const { return impl_->baseline; }

ReplayResult Replayer::Run(const ReplayOptions& options) {
  ReplayResult r;
  r.status = ReplayStatus::kError;
  r.message = "not implemented yet";
  return r;
}

ReplayResult Replay(const Trace& trace, const ReplayOptions& options) {
  absl::StatusOr<std::unique_ptr<Replayer>> replayer = Replayer::Create(trace);
  if (!replayer.ok()) {
    ReplayResult r;
    r.status = ReplayStatus::kError;
    r.message = std::string(replayer.status().message());
    r.policy = options.policy;
    r.mode = options.mode;
    return r;
  }
  return (*replayer)->Run(options);
}

}  // namespace remat
