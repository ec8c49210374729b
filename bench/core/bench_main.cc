// A development entry point for `entrokv bench` alone (it builds in a core-only tree too); the
// shipped `entrokv` binary runs the same RunBench from the same library.
#include <string>
#include <vector>

#include "client/cli/command.h"

int main(int argc, char** argv) {
  return entrokv::cli::RunBench(std::vector<std::string>(argv + 1, argv + argc));
}
