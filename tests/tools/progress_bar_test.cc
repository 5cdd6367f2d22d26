#include "tools/progress_bar.h"

#include <cstdio>
#include <string>

#include "gtest/gtest.h"

namespace remat::sim {
namespace {

std::string Contents(std::FILE* file) {
  std::string text;
  std::rewind(file);
  for (int c = std::fgetc(file); c != EOF; c = std::fgetc(file)) text += static_cast<char>(c);
  return text;
}

TEST(ProgressBarTest, Frames) {
  EXPECT_EQ(ProgressBar::Frame(0, 10, "a", 10), "[..........] 0/10  a");
  EXPECT_EQ(ProgressBar::Frame(5, 10, "b", 10), "[#####.....] 5/10  b");
  EXPECT_EQ(ProgressBar::Frame(10, 10, "c", 10), "[##########] 10/10  c");
  EXPECT_EQ(ProgressBar::Frame(1, 3, "", 6), "[##....] 1/3  ");
  EXPECT_EQ(ProgressBar::Frame(0, 0, "", 4), "[####] 0/0  ");
}

TEST(ProgressBarTest, DisabledWritesNothing) {
  std::FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  ProgressBar bar(file, false);
  bar.Update(1, 2, "x");
  bar.Finish();
  EXPECT_EQ(Contents(file), "");
  std::fclose(file);
}

TEST(ProgressBarTest, EnabledRedrawsInPlaceAndErases) {
  std::FILE* file = std::tmpfile();
  ASSERT_NE(file, nullptr);
  ProgressBar bar(file, true);
  bar.Update(1, 2, "long label");
  bar.Update(2, 2, "x");
  bar.Finish();
  const std::string first = ProgressBar::Frame(1, 2, "long label");
  const std::string second = ProgressBar::Frame(2, 2, "x");
  const std::string padded_second = second + std::string(first.size() - second.size(), ' ');
  EXPECT_EQ(Contents(file), "\r" + first + "\r" + padded_second + "\r" + std::string(second.size(), ' ') + "\r");
  std::fclose(file);
}

}  // namespace
}  // namespace remat::sim
