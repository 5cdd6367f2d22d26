// The C entry points of libremat_cuda.so: see c_api.h for the contract.
#include "integration/cuda/c_api.h"

#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <torch/headeronly/version.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/arena.h"
#include "integration/cuda/cuda_allocator.h"
#include "integration/cuda/cuda_device_memory.h"
#include "integration/engine_session.h"
#include "runtime/byte_size.h"
#include "runtime/config.h"

namespace remat::integration {
namespace {

void CopyError(const std::string& message, char* error, std::size_t error_size) {
  if (error == nullptr || error_size == 0) return;
  const std::size_t n = std::min(message.size(), error_size - 1);
  std::memcpy(error, message.data(), n);
  error[n] = '\0';
}

// 0 for OK, else the status code's number (never 0) with the message in `error`.
int Report(const absl::Status& status, char* error, std::size_t error_size) {
  if (status.ok()) return 0;
  CopyError(std::string(status.message()), error, error_size);
  return static_cast<int>(status.code());
}

// "contiguous", "stitch" or "stitch:SIZE" (a power of two; the device checks it is a multiple of its granularity),
// from `arena`, else REMAT_ARENA, else contiguous.
absl::Status ArenaFrom(const char* arena, CudaAllocatorOptions* options) {
  std::string source = "arena";
  const char* text = arena;
  if (text == nullptr || text[0] == '\0') {
    text = std::getenv("REMAT_ARENA");
    source = "REMAT_ARENA";
  }
  if (text == nullptr || text[0] == '\0') return absl::OkStatus();
  const std::string value(text);
  const std::size_t colon = value.find(':');
  const std::string kind = value.substr(0, colon);
  const auto unknown = [&] {
    return absl::InvalidArgumentError(absl::StrCat("remat: unknown ", source, " '", value,
                                                   "'; expected contiguous, stitch or stitch:SIZE (such as 2MiB)"));
  };
  if (kind == "contiguous" && colon == std::string::npos) return absl::OkStatus();
  if (kind != "stitch") return unknown();
  options->arena = cuda::DeviceArenaKind::kStitch;
  if (colon == std::string::npos) return absl::OkStatus();
  absl::StatusOr<std::uint64_t> granule = ParseByteSize(value.substr(colon + 1));
  if (!granule.ok() || *granule < 4096 || (*granule & (*granule - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("remat: ", source, " '", value,
                                                   "': the granule must be a power of two of at least 4 KiB (a "
                                                   "multiple of the device's granularity, 2 MiB on most GPUs)"));
  }
  options->stitch_granule = static_cast<std::size_t>(*granule);
  return absl::OkStatus();
}

absl::StatusOr<CudaAllocatorOptions> OptionsFrom(const char* budget, const char* host_budget) {
  absl::StatusOr<Settings> env = SettingsFromEnvironment();
  if (!env.ok()) return env.status();
  CudaAllocatorOptions options;
  std::optional<BudgetSetting> setting = env->budget;
  if (budget != nullptr && budget[0] != '\0') {
    absl::StatusOr<BudgetSetting> parsed = ParseBudget(budget);
    if (!parsed.ok()) return parsed.status();
    setting = *parsed;
  }
  if (!setting.has_value()) {
    return absl::InvalidArgumentError(
        "remat: no CUDA budget: pass one (e.g. \"6GiB\" or \"0.5\" of device memory) or set REMAT_BUDGET");
  }
  if (setting->bytes.has_value()) options.budget = static_cast<std::size_t>(*setting->bytes);
  if (setting->fraction.has_value()) options.budget_fraction = *setting->fraction;
  if (host_budget != nullptr && host_budget[0] != '\0') {
    absl::StatusOr<std::uint64_t> parsed = ParseByteSize(host_budget);
    if (!parsed.ok()) return parsed.status();
    options.host_budget = static_cast<std::size_t>(*parsed);
  } else if (env->host_budget.has_value()) {
    options.host_budget = static_cast<std::size_t>(*env->host_budget);
  }
  return options;
}

RematCudaAllocator* Pluggable() {
  if (RematCudaAllocator* installed = InstalledCudaAllocator()) return installed;
  static std::mutex mu;
  static RematCudaAllocator* own = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (own == nullptr) {
    absl::StatusOr<CudaAllocatorOptions> options = OptionsFrom(nullptr, nullptr);
    if (options.ok()) {
      if (absl::Status chosen = ArenaFrom(nullptr, &*options); !chosen.ok()) options = chosen;
    }
    TORCH_CHECK(options.ok(), std::string(options.status().message()));
    own = new RematCudaAllocator(cuda::RealCudaRuntime(), *options, TorchCudaStreams());
  }
  return own;
}

}  // namespace
}  // namespace remat::integration

extern "C" {

int remat_install_cuda_allocator(const char* budget, const char* host_budget, const char* arena, char* error,
                                 std::size_t error_size) {
  using namespace remat::integration;
  try {
    absl::StatusOr<CudaAllocatorOptions> options = OptionsFrom(budget, host_budget);
    if (options.ok()) {
      if (absl::Status chosen = ArenaFrom(arena, &*options); !chosen.ok()) options = chosen;
    }
    absl::Status status = options.ok() ? InstallRematCudaAllocator(*options) : options.status();
    return Report(status, error, error_size);
  } catch (const c10::Error& e) {
    CopyError(e.what_without_backtrace(), error, error_size);
  } catch (const std::exception& e) {
    CopyError(e.what(), error, error_size);
  }
  return static_cast<int>(absl::StatusCode::kInternal);
}

const char* remat_cuda_torch_version() {
  static const std::string version = absl::StrCat(TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR);
  return version.c_str();
}

int remat_cuda_set_pressure_handler(int device, void* handler, char* error, std::size_t error_size) {
  using namespace remat::integration;
  RematCudaAllocator* installed = InstalledCudaAllocator();
  if (installed == nullptr) {
    return Report(absl::FailedPreconditionError(
                      "remat: no remat CUDA allocator is installed to set a pressure handler on"),
                  error, error_size);
  }
  if (RematEngineEnabled()) {
    return Report(absl::FailedPreconditionError("remat: the remat engine is the CUDA pressure handler while it runs; "
                                                "disable it (remat_cuda_disable_engine) before setting another"),
                  error, error_size);
  }
  try {
    installed->SetPressureHandler(static_cast<c10::DeviceIndex>(device), static_cast<remat::PressureHandler*>(handler));
    return 0;
  } catch (const c10::Error& e) {
    CopyError(e.what_without_backtrace(), error, error_size);
  } catch (const std::exception& e) {
    CopyError(e.what(), error, error_size);
  }
  return static_cast<int>(absl::StatusCode::kInternal);
}

int remat_cuda_enable_engine(int device, const char* policy, const char* costs, const char* offload,
                             const char* host_budget, char* error, std::size_t error_size) {
  using namespace remat::integration;
  try {
    EngineSessionOptions options;
    auto given = [](const char* text) -> std::optional<std::string> {
      return text == nullptr || text[0] == '\0' ? std::nullopt : std::optional<std::string>(text);
    };
    absl::StatusOr<PagingSetting> paging = ResolvePaging(given(offload), given(host_budget));
    if (!paging.ok()) return Report(paging.status(), error, error_size);
    options.offload = paging->offload;
    options.host_budget = paging->host_budget;
    options.bandwidth_bytes_per_s = kCudaLinkBandwidthBytesPerS;
    options.latency_ns = kCudaLinkLatencyNs;
    if (policy != nullptr && policy[0] != '\0') {
      options.policy = policy;
    } else if (const char* from_environment = std::getenv("REMAT_POLICY");
               from_environment != nullptr && from_environment[0] != '\0') {
      options.policy = from_environment;  // checked by the engine like any name
    }
    if (costs != nullptr && costs[0] != '\0') options.costs = costs;
    RematCudaAllocator* allocator = InstalledCudaAllocator();
    if (allocator == nullptr) {  // ForInstalledAllocator says so
      return Report(CudaDeviceMemory::ForInstalledAllocator(0).status(), error, error_size);
    }
    if (device == -1) {  // the calling thread's current device
      absl::StatusOr<int> current = allocator->runtime()->GetDevice();
      if (!current.ok()) return Report(current.status(), error, error_size);
      device = *current;
    }
    if (device < 0 || device >= RematCudaAllocator::kMaxDevices) {
      return Report(absl::InvalidArgumentError(absl::StrCat("remat: CUDA device ", device,
                                                            " is not valid: a device index is >= 0 (-1: the current "
                                                            "device)")),
                    error, error_size);
    }
    const std::vector<int> engines = RematEngineDevices();
    if (std::find(engines.begin(), engines.end(), device) != engines.end()) {
      return Report(absl::AlreadyExistsError(absl::StrCat("remat: the engine already runs on CUDA device ", device)),
                    error, error_size);
    }
    absl::StatusOr<std::unique_ptr<CudaDeviceMemory>> memory =
        CudaDeviceMemory::ForInstalledAllocator(static_cast<c10::DeviceIndex>(device));
    if (!memory.ok()) return Report(memory.status(), error, error_size);
    if (allocator->Device(static_cast<c10::DeviceIndex>(device)).HasPressureHandler()) {
      return Report(absl::FailedPreconditionError(absl::StrCat(
                        "remat: CUDA device ", device, " has a pressure handler set through "
                        "remat_cuda_set_pressure_handler; remove it (nullptr) before switching the engine on")),
                    error, error_size);
    }
    absl::StatusOr<std::size_t> budget = InstalledCudaAllocator()->Device(static_cast<c10::DeviceIndex>(device)).Budget();
    if (!budget.ok()) return Report(budget.status(), error, error_size);
    options.budget = *budget;
    return Report(EnableRematEngineOn(options, *std::move(memory)), error, error_size);
  } catch (const c10::Error& e) {
    CopyError(e.what_without_backtrace(), error, error_size);
  } catch (const std::exception& e) {
    CopyError(e.what(), error, error_size);
  }
  return static_cast<int>(absl::StatusCode::kInternal);
}

int remat_cuda_disable_engine(char* error, std::size_t error_size) {
  using namespace remat::integration;
  try {
    return Report(DisableRematEngine(), error, error_size);
  } catch (const std::exception& e) {
    CopyError(e.what(), error, error_size);
  }
  return static_cast<int>(absl::StatusCode::kInternal);
}

void* remat_malloc(std::size_t size, int device, cudaStream_t stream) {
  if (size == 0) return nullptr;
  return remat::integration::Pluggable()->Malloc(size, static_cast<c10::DeviceIndex>(device), stream);
}

void remat_free(void* ptr, std::size_t size, int device, cudaStream_t stream) {
  remat::integration::Pluggable()->Free(ptr);
}

void remat_init(int device_count) { remat::integration::Pluggable()->init(device_count); }

void remat_reset() { remat::integration::Pluggable()->emptyCache(); }

void remat_set_memory_fraction(double fraction, int device) {
  remat::integration::Pluggable()->setMemoryFraction(fraction, static_cast<c10::DeviceIndex>(device));
}

void* remat_base_alloc(void* ptr, std::size_t* size) {
  return remat::integration::Pluggable()->getBaseAllocation(ptr, size);
}

void remat_record_stream(void* ptr, cudaStream_t stream) {
  remat::integration::Pluggable()->RecordStream(ptr, stream);
}

}  // extern "C"
