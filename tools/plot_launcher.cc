#include "tools/plot_launcher.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

extern char** environ;

namespace remat::sim {
namespace {

bool IsExecutable(const std::string& path) { return ::access(path.c_str(), X_OK) == 0; }

}  // namespace

std::string FindPython(const char* remat_python, const char* remat_venv, const char* home,
                       bool (*is_executable)(const std::string&)) {
  if (remat_python != nullptr && *remat_python != '\0') return remat_python;
  if (remat_venv != nullptr && *remat_venv != '\0') {
    const std::string venv = absl::StrCat(remat_venv, "/bin/python");
    if (is_executable(venv)) return venv;
  }
  if (home != nullptr && *home != '\0') {
    const std::string venv = absl::StrCat(home, "/.cache/remat/venv/bin/python");
    if (is_executable(venv)) return venv;
  }
  return "python3";
}

std::string FindPython() {
  return FindPython(std::getenv("REMAT_PYTHON"), std::getenv("REMAT_VENV"), std::getenv("HOME"), &IsExecutable);
}

std::string PlotScriptPath() {
  if (const char* script = std::getenv("REMAT_PLOT_SCRIPT"); script != nullptr && *script != '\0') return script;
  return REMAT_PLOT_SCRIPT_DEFAULT;
}

std::string TimelineScriptPath() {
  if (const char* script = std::getenv("REMAT_TIMELINE_SCRIPT"); script != nullptr && *script != '\0') return script;
  return REMAT_TIMELINE_SCRIPT_DEFAULT;
}

absl::Status RunPlot(const std::string& python, const std::string& script, const std::string& csv_path,
                     const std::string& png_path) {
  return RunPythonScript(python, {script, "--csv", csv_path, "--out", png_path});
}

absl::Status RunPythonScript(const std::string& python, std::vector<std::string> script_and_args) {
  std::vector<std::string> args = {python};
  args.insert(args.end(), script_and_args.begin(), script_and_args.end());
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const std::string command = absl::StrJoin(args, " ");

  pid_t pid = 0;
  if (int error = ::posix_spawnp(&pid, python.c_str(), nullptr, nullptr, argv.data(), environ); error != 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot run the plot interpreter '", python,
                                                      "': ", std::strerror(error),
                                                      " (set REMAT_PYTHON to a Python with matplotlib)"));
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return absl::InternalError(absl::StrCat("waitpid failed for: ", command));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
  if (WIFEXITED(status) && WEXITSTATUS(status) == 3) {
    return absl::FailedPreconditionError(absl::StrCat(
        "matplotlib is not available to '", python,
        "'; install it there (pip install matplotlib) or set REMAT_PYTHON to an interpreter that has it"));
  }
  if (WIFEXITED(status)) {
    return absl::InternalError(absl::StrCat("plot command failed with exit status ", WEXITSTATUS(status), ": ",
                                            command));
  }
  return absl::InternalError(absl::StrCat("plot command was killed by signal ", WTERMSIG(status), ": ", command));
}

}  // namespace remat::sim
