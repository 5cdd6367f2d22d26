// PlotLauncher: runs remat-sim's Python plot scripts: tools/plot_overhead.py on a results CSV (the
// overhead-vs-ratio figure, --plot) and integration/python/remat/plot.py on a timeline (--timeline).
//
// Contract:
//   - The interpreter is $REMAT_PYTHON when set (used as given, even if it turns out not to work: the user asked
//     for it), else $REMAT_VENV/bin/python (the Makefile's venv setting), else ~/.cache/remat/venv/bin/python,
//     each when that file is executable, else `python3` from PATH.
//   - The overhead script is $REMAT_PLOT_SCRIPT when set, else the plot_overhead.py of the source tree remat-sim
//     was built from; the timeline script $REMAT_TIMELINE_SCRIPT, else that tree's integration/python/remat/plot.py
//     (run as a file: it imports neither remat nor torch).
//   - RunPlot spawns `PYTHON SCRIPT --csv CSV --out PNG` without a shell (no quoting issues), lets the script's
//     stderr through, and returns OK only when it exits 0. The script exits 3 with a message naming the
//     interpreter when matplotlib cannot be imported; RunPlot turns that into FailedPrecondition saying how to
//     fix it, any other failure into Internal naming the command and its exit status.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace remat::sim {

// The arguments are the environment values (nullptr when unset); `is_executable` tests a path.
std::string FindPython(const char* remat_python, const char* remat_venv, const char* home,
                       bool (*is_executable)(const std::string&));
std::string FindPython();  // from the real environment
std::string PlotScriptPath();
std::string TimelineScriptPath();

absl::Status RunPlot(const std::string& python, const std::string& script, const std::string& csv_path,
                     const std::string& png_path);
// `python script_and_args...`, with RunPlot's error handling (exit 3: matplotlib missing).
absl::Status RunPythonScript(const std::string& python, std::vector<std::string> script_and_args);

}  // namespace remat::sim
