// entrokv status | models | sequences: what a running entrokvd holds, for people and scripts.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli/args.h"
#include "client/cli/command.h"
#include "client/cli/server_args.h"
#include "client/cpp/client.h"
#include "core/util/json.h"
#include "core/util/page_count.h"
#include "core/util/status_macros.h"
#include "google/protobuf/util/json_util.h"
#include "wire/convert.h"

namespace entrokv::cli {
namespace {

using wire::BackendName;
using wire::LayoutName;

// Parses the shared options; returns a usage exit code, or -1 to go on.
int Parse(ArgParser& args, const std::vector<std::string>& argv, const std::string& command,
          ClientOptions* options) {
  auto parsed = args.Parse(argv);
  if (!parsed.ok()) return UsageError(command, parsed.status());
  if (!*parsed) return kExitOk;
  auto server = ServerOptions(args);
  if (!server.ok()) return UsageError(command, server.status());
  *options = *server;
  return -1;
}

absl::StatusOr<std::string> StatusReport(Client& client, bool json) {
  ASSIGN_OR_RETURN(const std::string ready, client.Health(""));
  ASSIGN_OR_RETURN(const std::string live, client.Health("entrokv.v1.CacheManager.liveness"));
  ASSIGN_OR_RETURN(const v1::ListModelsResponse models, client.ListModels());
  Json pools = Json::array();
  std::string text = absl::StrFormat("entrokvd: readiness %s, liveness %s, %d model(s)\n", ready,
                                     live, models.pools_size());
  if (!models.pools().empty()) {
    absl::StrAppend(&text, absl::StrFormat("%-20s %-6s %-6s %12s %12s %9s %10s %12s\n", "model",
                                           "layout", "pool", "used frames", "capacity", "occupied",
                                           "sequences", "evicted pages"));
  }
  for (const v1::PoolInfo& pool : models.pools()) {
    v1::GetPoolStatsRequest request;
    request.set_model_id(pool.model_id());
    ASSIGN_OR_RETURN(const v1::PoolStats stats, client.GetPoolStats(request));
    const double occupied = stats.capacity_frames() > 0
                                ? static_cast<double>(stats.used_frames()) /
                                      static_cast<double>(stats.capacity_frames())
                                : 0.0;
    absl::StrAppend(
        &text, absl::StrFormat("%-20s %-6s %-6s %12d %12d %8.1f%% %10d %12d\n", pool.model_id(),
                               LayoutName(pool.frame_layout()), BackendName(pool.backend()),
                               stats.used_frames(), stats.capacity_frames(), 100 * occupied,
                               stats.sequences_active(), stats.pages_evicted_total()));
    pools.push_back({{"model", pool.model_id()},
                     {"used_frames", stats.used_frames()},
                     {"free_frames", stats.free_frames()},
                     {"capacity_frames", stats.capacity_frames()},
                     {"sequences_active", stats.sequences_active()},
                     {"pages_evicted_total", stats.pages_evicted_total()},
                     {"bytes_moved_total", stats.bytes_moved_total()}});
  }
  if (!json) return text;
  const Json out = {{"readiness", ready}, {"liveness", live}, {"pools", std::move(pools)}};
  return DumpJson(out) + "\n";
}

absl::StatusOr<std::string> ModelsReport(Client& client, bool json) {
  ASSIGN_OR_RETURN(const v1::ListModelsResponse models, client.ListModels());
  if (json) {
    std::string out;
    google::protobuf::util::JsonPrintOptions options;
    options.preserve_proto_field_names = true;
    options.always_print_primitive_fields = true;
    const auto status = google::protobuf::util::MessageToJsonString(models, &out, options);
    if (!status.ok()) return absl::InternalError(std::string(status.message()));
    return out + "\n";
  }
  std::string text = absl::StrFormat("%-20s %6s %9s %6s %6s %6s %-6s %-6s %14s %12s  %s\n", "model",
                                     "layers", "q heads", "kv", "dim", "page", "layout", "pool",
                                     "capacity bytes", "frame bytes", "devices");
  for (const v1::PoolInfo& pool : models.pools()) {
    const v1::ModelGeometry& g = pool.geometry();
    // "0" for a model on one device; "tp=4: 0,1,2,3" for a tensor-parallel one, rank by rank.
    std::vector<std::string> devices;
    for (const v1::RankArena& rank : pool.ranks()) devices.push_back(absl::StrCat(rank.device()));
    const std::string placement =
        pool.ranks_size() > 1
            ? absl::StrCat("tp=", pool.ranks_size(), ": ", absl::StrJoin(devices, ","))
            : absl::StrJoin(devices, ",");
    absl::StrAppend(
        &text,
        absl::StrFormat("%-20s %6d %9d %6d %6d %6d %-6s %-6s %14d %12d  %s\n", pool.model_id(),
                        g.layers(), g.query_heads(), g.kv_groups(), g.head_dim(), g.page_size(),
                        LayoutName(pool.frame_layout()), BackendName(pool.backend()),
                        pool.capacity_bytes(), pool.frame_bytes(), placement));
  }
  return text;
}

absl::StatusOr<std::string> SequencesReport(Client& client, const std::string& only_model,
                                            bool json) {
  ASSIGN_OR_RETURN(const v1::ListModelsResponse models, client.ListModels());
  Json rows = Json::array();
  std::string text = absl::StrFormat("%-20s %-32s %12s %12s %13s %12s %-12s %8s %12s\n", "model",
                                     "sequence", "tokens", "live frames", "block tables",
                                     "table pages", "tenant", "priority", "quota");
  for (const v1::PoolInfo& pool : models.pools()) {
    if (!only_model.empty() && pool.model_id() != only_model) continue;
    // Every sequence has one table per (layer, group) and one entry per logical page in each
    // (evicted entries are -1), so the counts follow from the geometry and the length: the
    // tables themselves, which can be large, are not fetched.
    const v1::ModelGeometry& geometry = pool.geometry();
    const int64_t tables = int64_t{geometry.layers()} * geometry.kv_groups();
    const int64_t page_size = std::max(1, geometry.page_size());
    v1::ListSequencesRequest request;
    request.set_model_id(pool.model_id());
    RETURN_IF_ERROR(client.ForEachSequence(request, [&](const v1::SequenceInfo& sequence) {
      const int64_t table_pages = PageCount(sequence.length_tokens(), page_size);
      // The quota a server-chosen budget has been given ("-": none, the sequence keeps what its
      // decisions keep); "preempt" when the daemon asked its owner to preempt it.
      const v1::PressureInfo& pressure = sequence.pressure();
      const std::string quota = pressure.preempt() ? "preempt"
                                : pressure.quota_frames() > 0
                                    ? absl::StrCat(pressure.quota_frames())
                                    : "-";
      absl::StrAppend(
          &text,
          absl::StrFormat("%-20s %-32s %12d %12d %13d %12d %-12s %8d %12s\n", pool.model_id(),
                          sequence.sequence_id(), sequence.length_tokens(), sequence.live_frames(),
                          tables, table_pages, sequence.tenant().empty() ? "-" : sequence.tenant(),
                          sequence.priority(), quota));
      rows.push_back({{"model", pool.model_id()},
                      {"sequence_id", sequence.sequence_id()},
                      {"length_tokens", sequence.length_tokens()},
                      {"live_frames", sequence.live_frames()},
                      {"block_tables", tables},
                      {"table_pages", table_pages},
                      {"tenant", sequence.tenant()},
                      {"priority", sequence.priority()},
                      {"quota_frames", pressure.quota_frames()},
                      {"preempt", pressure.preempt()}});
      return absl::OkStatus();
    }));
  }
  if (!json) return text;
  return DumpJson(Json{{"sequences", std::move(rows)}}) + "\n";
}

int Print(const std::string& command, const absl::StatusOr<std::string>& report) {
  if (!report.ok()) return ServerError(command, report.status());
  std::fputs(report->c_str(), stdout);
  return kExitOk;
}

}  // namespace

int RunStatus(const std::vector<std::string>& argv) {
  ArgParser args("status", "[--server ADDR] [--json]");
  AddServerOptions(&args);
  args.Flag("json", false, "print one JSON object");
  ClientOptions options;
  if (const int code = Parse(args, argv, "status", &options); code >= 0) return code;
  options.max_attempts = 1;  // status reports what is there now, without waiting
  Client client(options);
  return Print("status", StatusReport(client, args.GetFlag("json")));
}

int RunModels(const std::vector<std::string>& argv) {
  ArgParser args("models", "[--server ADDR] [--json]");
  AddServerOptions(&args);
  args.Flag("json", false, "print the ListModels response as JSON");
  ClientOptions options;
  if (const int code = Parse(args, argv, "models", &options); code >= 0) return code;
  Client client(options);
  return Print("models", ModelsReport(client, args.GetFlag("json")));
}

int RunSequences(const std::vector<std::string>& argv) {
  ArgParser args("sequences", "[--server ADDR] [--model ID] [--json]");
  AddServerOptions(&args);
  args.Option("model", "", "only this model's sequences");
  args.Flag("json", false, "print one JSON object");
  ClientOptions options;
  if (const int code = Parse(args, argv, "sequences", &options); code >= 0) return code;
  Client client(options);
  return Print("sequences", SequencesReport(client, args.Get("model"), args.GetFlag("json")));
}

int RunUnregister(const std::vector<std::string>& argv) {
  ArgParser args("unregister", "[--server ADDR] --model ID [--force]");
  AddServerOptions(&args);
  args.Option("model", "", "the model to remove");
  args.Flag("force", false, "close its open sequences first instead of refusing");
  ClientOptions options;
  if (const int code = Parse(args, argv, "unregister", &options); code >= 0) return code;
  Client client(options);
  v1::UnregisterModelRequest request;
  request.set_model_id(args.Get("model"));
  request.set_force(args.GetFlag("force"));
  const absl::StatusOr<v1::UnregisterModelResponse> response = client.UnregisterModel(request);
  if (!response.ok()) return ServerError("unregister", response.status());
  std::printf("unregistered %s (%lld sequences closed)\n", request.model_id().c_str(),
              static_cast<long long>(response->closed_sequences()));
  return kExitOk;
}

}  // namespace entrokv::cli
