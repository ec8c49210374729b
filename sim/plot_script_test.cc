#include <filesystem>

#include "gtest/gtest.h"
#include "sim/report.h"

namespace entrokv::sim {
namespace {

// The build copies the plot script beside each binary that runs it, so a moved build finds it
// without the source tree.
TEST(PlotScriptTest, DefaultIsBesideTheRunningBinary) {
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe");
  const std::filesystem::path script = DefaultPlotScript();
  EXPECT_EQ(script, exe.parent_path() / kPlotScriptName);
  EXPECT_TRUE(std::filesystem::exists(script)) << script;
}

}  // namespace
}  // namespace entrokv::sim
