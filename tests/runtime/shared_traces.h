// The shared traces (../shared/traces/dtr) for tests: REMAT_SHARED_DIR names the shared directory (CI sets it; the
// default is the one beside this checkout on the development machine).
#pragma once

#include <cstdlib>
#include <string>

namespace remat::testing {

inline std::string SharedDir() {
  const char* env = std::getenv("REMAT_SHARED_DIR");
  return env != nullptr && *env ? env : "/work/main/../shared";
}

inline std::string SharedTracePath(const std::string& file) { return SharedDir() + "/traces/dtr/" + file; }

inline constexpr char kUnetTrace[] = "unet-6-8000000000.0-2020-10-1-10-57-18-default.log";
inline constexpr char kResnet32Trace[] = "resnet32-56-9000000000.0-2020-10-1-13-3-30-default.log";
inline constexpr char kLstmTrace[] = "lstm-128-11000000000.0-2020-10-1-16-38-52-default.log";

}  // namespace remat::testing
