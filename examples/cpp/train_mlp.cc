// remat from a LibTorch program: an MLP (explicit weight tensors, ATen ops, autograd, plain SGD; --layers linear
// layers, default 8) trains on synthetic data three times from the same initial weights:
//   1. without remat: the reference losses and final weights;
//   2. under remat::integration::EngineGuard with a huge budget: the unconstrained peak of remat's arena;
//   3. under EngineGuard with --budget (a fraction of that peak, or bytes): evictions and rematerializations.
// It prints both peaks, the engine's counts, and whether run 3's losses and final weights are bitwise identical
// to run 1's. Exit code 0 only if they are (1: they differ; 2: bad command line; 3: remat failed).
//
// Why 8 layers and not 3: the activations are all the same size, one op of the backward pass (relu's) needs three
// of them at once, and a 3-layer MLP keeps only about four alive at its peak: with 3 layers every budget we tried
// from 0.5 to 0.9 of the peak ran out of memory (no hole left for one activation). The peak grows by one
// activation per layer while the working set of one op does not.
//
// Only narrow ATen headers (never torch/torch.h: it takes most of a minute to compile).
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/log_softmax.h>
#include <ATen/ops/nll_loss.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/relu.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "integration/cpu_allocator.h"
#include "integration/engine_session.h"
#include "integration/same_bytes.h"
#include "policies/registry.h"
#include "runtime/config.h"

namespace {

using remat::integration::EngineGuard;
using remat::integration::EngineSessionOptions;

// Large enough for the unconstrained run: the arena reserves it with MAP_NORESERVE, untouched pages cost nothing.
constexpr std::size_t kHugeBudget = std::size_t{4} << 30;

struct Config {
  std::string budget = "0.8";
  std::string policy = "dtr-eq";
  std::string costs = "estimated";  // reproducible eviction choices (op_cost.h); "measured": wall time
  int steps = 4;
  int layers = 8;
  std::int64_t batch = 2048;
  std::int64_t in = 256;
  std::int64_t hidden = 128;
  std::int64_t classes = 10;
  float lr = 0.05f;
};

struct Model {
  std::vector<at::Tensor> params;  // w1, b1, w2, b2, w3, b3
};

struct Result {
  std::vector<float> losses;
  std::vector<at::Tensor> weights;
};

int Usage(const char* argv0, const std::string& error) {
  if (!error.empty()) std::fprintf(stderr, "train_mlp: %s\n", error.c_str());
  std::fprintf(stderr,
               "usage: %s [--budget FRACTION_OR_BYTES] [--policy NAME] [--steps N] [--costs measured|estimated]\n"
               "          [--layers N] [--batch N] [--hidden N]\n"
               "  --budget  a fraction of the unconstrained peak with a decimal point (default 0.8), or bytes (8MiB)\n"
               "  --policy  a registered eviction policy (default dtr-eq)\n"
               "  --costs   op costs the policy sees: estimated (default, the same choices every run) or measured\n",
               argv0);
  return 2;
}

bool ParsePositive(std::string_view text, std::int64_t* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  const long long value = std::strtoll(std::string(text).c_str(), &end, 10);
  if (end == nullptr || *end != '\0' || value <= 0) return false;
  *out = value;
  return true;
}

double MiB(std::uint64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// Same initial weights for every run: made once, cloned before a run (outside remat, so they are constants).
Model InitialModel(const Config& c) {
  at::manual_seed(1234);
  Model m;
  std::vector<std::int64_t> dims = {c.in};
  for (int layer = 0; layer + 1 < c.layers; ++layer) dims.push_back(c.hidden);
  dims.push_back(c.classes);
  for (int layer = 0; layer < c.layers; ++layer) {
    const double scale = 1.0 / std::sqrt(static_cast<double>(dims[layer]));
    m.params.push_back(at::randn({dims[layer], dims[layer + 1]}).mul_(scale));
    m.params.push_back(at::randn({dims[layer + 1]}).mul_(0.01));
  }
  return m;
}

Model Clone(const Model& m) {
  Model copy;
  for (const at::Tensor& p : m.params) copy.params.push_back(p.clone().set_requires_grad(true));
  return copy;
}

// h = relu(h W + b) per hidden layer (addmm: one op per layer), then the logits.
at::Tensor Forward(const Model& m, const at::Tensor& x) {
  const auto& p = m.params;
  at::Tensor h = x;
  for (std::size_t i = 0; i + 2 < p.size(); i += 2) h = at::relu(at::addmm(p[i + 1], h, p[i]));
  return at::addmm(p.back(), h, p[p.size() - 2]);
}

// `steps` SGD steps over the same batch, updating `m` in place; returns each step's loss and the final weights.
Result Train(const Config& c, Model m, const at::Tensor& x, const at::Tensor& y) {
  Result result;
  for (int step = 0; step < c.steps; ++step) {
    {
      at::Tensor loss = at::nll_loss(at::log_softmax(Forward(m, x), /*dim=*/1), y);
      loss.backward();
      result.losses.push_back(loss.item<float>());
    }
    at::NoGradGuard no_grad;
    for (at::Tensor& p : m.params) {
      p.sub_(p.grad(), c.lr);
      p.mutable_grad() = at::Tensor();  // fresh gradients every step
    }
  }
  result.weights = m.params;
  return result;
}

struct RunStats {
  std::uint64_t arena_peak = 0;
  std::int64_t evictions = 0;
  std::int64_t rematerializations = 0;
  std::int64_t relocations = 0;
};

// Trains under EngineGuard; the stats are read after the guard is gone (the last arena's and engine's numbers).
Result TrainUnderRemat(const Config& c, std::size_t budget, const Model& initial, const at::Tensor& x,
                       const at::Tensor& y, RunStats* stats) {
  Model m = Clone(initial);  // outside remat: parameters are constants, never evicted
  Result result;
  {
    EngineGuard guard({.budget = budget, .policy = c.policy, .costs = c.costs});
    result = Train(c, std::move(m), x, y);
  }
  absl::StatusOr<remat::integration::CpuArenaStats> arena = remat::integration::GetCpuArenaStats();
  absl::StatusOr<remat::integration::BridgeStats> engine = remat::integration::GetEngineStats();
  TORCH_CHECK(arena.ok() && engine.ok(), "remat: no statistics after the run");
  stats->arena_peak = arena->peak_allocated_bytes;
  stats->evictions = engine->engine.evictions;
  stats->rematerializations = engine->engine.rematerializations;
  stats->relocations = engine->engine.relocations;
  return result;
}

bool SameLosses(const Result& a, const Result& b) {
  return a.losses.size() == b.losses.size() &&
         std::memcmp(a.losses.data(), b.losses.data(), a.losses.size() * sizeof(float)) == 0;
}

bool SameWeights(const Result& a, const Result& b) {
  if (a.weights.size() != b.weights.size()) return false;
  for (std::size_t i = 0; i < a.weights.size(); ++i) {
    if (!remat::integration::SameBytes(a.weights[i], b.weights[i])) return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--help" || flag == "-h") return Usage(argv[0], "");
    if (i + 1 >= argc) return Usage(argv[0], "missing value for " + std::string(flag));
    const std::string value = argv[++i];
    std::int64_t n = 0;
    if (flag == "--budget") {
      c.budget = value;
    } else if (flag == "--policy") {
      c.policy = value;
    } else if (flag == "--costs") {
      c.costs = value;
    } else if (flag == "--steps" || flag == "--batch" || flag == "--hidden" || flag == "--layers") {
      if (!ParsePositive(value, &n)) return Usage(argv[0], std::string(flag) + " wants a positive integer, got \"" + value + "\"");
      if (flag == "--steps") c.steps = static_cast<int>(n);
      if (flag == "--batch") c.batch = n;
      if (flag == "--hidden") c.hidden = n;
      if (flag == "--layers") c.layers = static_cast<int>(n);
    } else {
      return Usage(argv[0], "unknown option " + std::string(flag));
    }
  }
  absl::StatusOr<remat::BudgetSetting> budget = remat::ParseBudget(c.budget);
  if (!budget.ok()) return Usage(argv[0], "--budget: " + std::string(budget.status().message()));
  if (absl::Status policy = remat::CheckPolicy(c.policy, "--policy", remat::PolicyNames()); !policy.ok()) {
    return Usage(argv[0], std::string(policy.message()));
  }
  if (c.costs != "measured" && c.costs != "estimated") {
    return Usage(argv[0], "--costs: expected measured or estimated, got \"" + c.costs + "\"");
  }

  std::printf("MLP: %d linear layers %lld -> %lld (x%d) -> %lld, relu, batch %lld; %d SGD steps; policy %s, costs %s\n",
              c.layers, static_cast<long long>(c.in), static_cast<long long>(c.hidden), c.layers - 1,
              static_cast<long long>(c.classes), static_cast<long long>(c.batch), c.steps, c.policy.c_str(),
              c.costs.c_str());
  try {
    const Model initial = InitialModel(c);
    at::manual_seed(42);
    const at::Tensor x = at::randn({c.batch, c.in});
    const at::Tensor y = at::randint(c.classes, {c.batch});

    const Result reference = Train(c, Clone(initial), x, y);

    RunStats unconstrained;
    const Result measured = TrainUnderRemat(c, kHugeBudget, initial, x, y, &unconstrained);
    std::printf("baseline peak: %llu bytes (%.2f MiB; remat's arena, unconstrained)\n",
                static_cast<unsigned long long>(unconstrained.arena_peak), MiB(unconstrained.arena_peak));

    const std::size_t bytes = budget->bytes ? static_cast<std::size_t>(*budget->bytes)
                                            : static_cast<std::size_t>(*budget->fraction *
                                                                       static_cast<double>(unconstrained.arena_peak));
    std::printf("budget: %llu bytes (%.2f MiB; --budget %s)\n", static_cast<unsigned long long>(bytes), MiB(bytes),
                c.budget.c_str());
    RunStats constrained;
    const Result remat = TrainUnderRemat(c, bytes, initial, x, y, &constrained);
    std::printf("remat peak: %llu bytes (%.2f MiB)\n", static_cast<unsigned long long>(constrained.arena_peak),
                MiB(constrained.arena_peak));
    std::printf("evictions: %lld\nrematerializations: %lld\nrelocations: %lld\n",
                static_cast<long long>(constrained.evictions), static_cast<long long>(constrained.rematerializations),
                static_cast<long long>(constrained.relocations));
    std::printf("losses:");
    for (std::size_t i = 0; i < reference.losses.size(); ++i) {
      std::printf(" %.6f/%.6f", reference.losses[i], remat.losses[i]);
    }
    std::printf("  (baseline/remat)\n");

    const bool unconstrained_same = SameLosses(reference, measured) && SameWeights(reference, measured);
    const bool losses_same = SameLosses(reference, remat);
    const bool weights_same = SameWeights(reference, remat);
    std::printf("unconstrained remat run bitwise identical: %s\n", unconstrained_same ? "yes" : "NO");
    std::printf("losses bitwise identical: %s\n", losses_same ? "yes" : "NO");
    std::printf("final weights bitwise identical: %s\n", weights_same ? "yes" : "NO");
    const bool identical = unconstrained_same && losses_same && weights_same;
    std::printf("result: %s\n", identical ? "IDENTICAL" : "DIFFERENT");
    return identical ? 0 : 1;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "train_mlp: remat failed: %s\n", e.what_without_backtrace());
    return 3;
  }
}
