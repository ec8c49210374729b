// A development entry point for `entrokv bench`, so the benchmark builds and runs in a core-only
// tree; the shipped `entrokv` binary registers the same RunBench.
#include <string>
#include <vector>

namespace entrokv::cli {
int RunBench(const std::vector<std::string>& args);
}  // namespace entrokv::cli

int main(int argc, char** argv) {
  return entrokv::cli::RunBench(std::vector<std::string>(argv + 1, argv + argc));
}
