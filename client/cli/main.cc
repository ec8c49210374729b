// entrokv: the command-line tool. `entrokv help` lists the subcommands.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "client/cli/command.h"

namespace entrokv::cli {
namespace {

constexpr Command kCommands[] = {
    {"select", "run the eviction core on a .npy statistic, offline", RunSelect},
    {"eval", "the evaluation report: every policy x budget x page size", RunEval},
    {"bench", "benchmarks (bench core: the CPU scoring path)", RunBench},
    {"policies", "the registered policies and the statistic each one scores", RunPolicies},
#ifdef ENTROKV_WITH_SERVER
    {"status", "daemon health and every pool's occupancy", RunStatus},
    {"models", "the registered models and their pools", RunModels},
    {"sequences", "open sequences with their lengths and block tables", RunSequences},
    {"unregister", "remove a model and release its pool", RunUnregister},
    {"replay", "a simulated worker end to end against entrokvd", RunReplay},
#endif
};

void PrintUsage(FILE* out) {
  std::fprintf(out, "usage: entrokv <command> [options]   (entrokv <command> --help)\n\n");
  for (const Command& command : kCommands) {
    std::fprintf(out, "  %-10s %s\n", command.name, command.summary);
  }
}

}  // namespace
}  // namespace entrokv::cli

int main(int argc, char** argv) {
  using namespace entrokv::cli;
  if (argc < 2 || std::strcmp(argv[1], "help") == 0 || std::strcmp(argv[1], "--help") == 0) {
    PrintUsage(argc < 2 ? stderr : stdout);
    return argc < 2 ? kExitUsage : kExitOk;
  }
  for (const Command& command : kCommands) {
    if (std::strcmp(argv[1], command.name) == 0) {
      return command.run(std::vector<std::string>(argv + 2, argv + argc));
    }
  }
  std::fprintf(stderr, "entrokv: unknown command '%s'\n", argv[1]);
  PrintUsage(stderr);
  return kExitUsage;
}
