#include "tools/plot_launcher.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace remat::sim {
namespace {

using ::testing::HasSubstr;

bool Always(const std::string&) { return true; }
bool Never(const std::string&) { return false; }
bool OnlyHomeVenv(const std::string& path) { return path == "/home/u/.cache/remat/venv/bin/python"; }

TEST(PlotLauncherTest, FindPythonPrefersRematPython) {
  EXPECT_EQ(FindPython("/opt/py/bin/python", "/venv", "/home/u", &Always), "/opt/py/bin/python");
  EXPECT_EQ(FindPython("/opt/py/bin/python", "/venv", "/home/u", &Never), "/opt/py/bin/python");
}

TEST(PlotLauncherTest, FindPythonThenRematVenvThenTheDefaultVenv) {
  EXPECT_EQ(FindPython(nullptr, "/venv", "/home/u", &Always), "/venv/bin/python");
  EXPECT_EQ(FindPython("", "/venv", "/home/u", &OnlyHomeVenv), "/home/u/.cache/remat/venv/bin/python");
  EXPECT_EQ(FindPython(nullptr, nullptr, "/home/u", &Always), "/home/u/.cache/remat/venv/bin/python");
}

TEST(PlotLauncherTest, FindPythonFallsBackToPython3) {
  EXPECT_EQ(FindPython(nullptr, "/venv", "/home/u", &Never), "python3");
  EXPECT_EQ(FindPython(nullptr, nullptr, nullptr, &Always), "python3");
}

TEST(PlotLauncherTest, PlotScriptExists) {
  EXPECT_TRUE(std::filesystem::is_regular_file(PlotScriptPath())) << PlotScriptPath();
}

// A temporary directory removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "remat-plot-test-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

void WriteFile(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST(PlotLauncherTest, MissingInterpreterIsAFailedPrecondition) {
  absl::Status status = RunPlot("/nonexistent/python9", PlotScriptPath(), "in.csv", "out.png");
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("/nonexistent/python9"));
  EXPECT_THAT(status.message(), HasSubstr("REMAT_PYTHON"));
}

TEST(PlotLauncherTest, ScriptExitThreeMeansMatplotlibMissing) {
  TempDir dir;
  WriteFile(dir.File("fake.sh"), "exit 3\n");
  absl::Status status = RunPlot("/bin/sh", dir.File("fake.sh"), "in.csv", "out.png");
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("matplotlib is not available to '/bin/sh'"));
}

TEST(PlotLauncherTest, OtherFailuresNameTheCommand) {
  TempDir dir;
  WriteFile(dir.File("fake.sh"), "exit 5\n");
  absl::Status status = RunPlot("/bin/sh", dir.File("fake.sh"), "in.csv", "out.png");
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("exit status 5"));
  EXPECT_THAT(status.message(), HasSubstr("--csv in.csv --out out.png"));
}

TEST(PlotLauncherTest, ArgumentsReachTheScript) {
  TempDir dir;
  // The fake script copies its arguments into the "png", proving the argv (spaces included) arrives intact.
  WriteFile(dir.File("fake.sh"), "printf '%s|' \"$@\" > \"$4\"\n");
  const std::string out = dir.File("a b.png");
  ASSERT_TRUE(RunPlot("/bin/sh", dir.File("fake.sh"), "my file.csv", out).ok());
  std::ifstream in(out);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "--csv|my file.csv|--out|" + out + "|");
}

// The real script with the real interpreter: the PNG signature proves matplotlib wrote an image.
TEST(PlotLauncherTest, RealScriptWritesAPng) {
  TempDir dir;
  WriteFile(dir.File("r.csv"),
            "trace,policy,mode,ratio,budget_bytes,result,overhead\n"
            "resnet32-56-9-default.log,dtr-eq,counter,0.9,9,pass,1.01\n"
            "resnet32-56-9-default.log,dtr-eq,counter,0.5,5,pass,1.2\n"
            "resnet32-56-9-default.log,lru,counter,0.9,9,pass,1.05\n"
            "resnet32-56-9-default.log,lru,counter,0.5,5,thrash,2.5\n"
            "unet-6-8-default.log,dtr-eq,counter,0.9,9,pass,1.0\n");
  absl::Status status = RunPlot(FindPython(), PlotScriptPath(), dir.File("r.csv"), dir.File("o.png"));
  ASSERT_TRUE(status.ok()) << status;
  std::ifstream in(dir.File("o.png"), std::ios::binary);
  char magic[8] = {};
  in.read(magic, 8);
  EXPECT_EQ(std::string(magic, 8), std::string("\x89PNG\r\n\x1a\n", 8));
}

TEST(PlotLauncherTest, RealScriptRejectsACsvWithoutItsColumns) {
  TempDir dir;
  WriteFile(dir.File("r.csv"), "trace,policy\nx,y\n");
  absl::Status status = RunPlot(FindPython(), PlotScriptPath(), dir.File("r.csv"), dir.File("o.png"));
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("exit status 2"));
  EXPECT_FALSE(std::filesystem::exists(dir.File("o.png")));
}

}  // namespace
}  // namespace remat::sim
