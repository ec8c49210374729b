#include "service/flags.h"

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/scoring/layer_scope.h"
#include "service/option_table.h"

namespace entrokv {

bool AbslParseFlag(absl::string_view text, Backend* backend, std::string* error) {
  absl::StatusOr<Backend> parsed = ParseBackend(text);
  if (!parsed.ok()) {
    *error = std::string(parsed.status().message());
    return false;
  }
  *backend = *parsed;
  return true;
}

std::string AbslUnparseFlag(Backend backend) { return std::string(BackendName(backend)); }

bool AbslParseFlag(absl::string_view text, FrameLayout* layout, std::string* error) {
  absl::StatusOr<FrameLayout> parsed = ParseFrameLayout(text);
  if (!parsed.ok()) {
    *error = std::string(parsed.status().message());
    return false;
  }
  *layout = *parsed;
  return true;
}

std::string AbslUnparseFlag(FrameLayout layout) { return std::string(FrameLayoutName(layout)); }

}  // namespace entrokv

namespace entrokv::service {

bool AbslParseFlag(absl::string_view text, ScopeSetting* setting, std::string* error) {
  if (text == "auto") {
    *setting = ScopeSetting::kAuto;
    return true;
  }
  absl::StatusOr<SelectionScope> scope = ParseSelectionScope("--selection_scope", text);
  if (!scope.ok()) {
    *error = absl::StrCat("'", text, "' is not a selection scope (auto, group, layer)");
    return false;
  }
  *setting = *scope == SelectionScope::kLayer ? ScopeSetting::kLayer : ScopeSetting::kGroup;
  return true;
}

bool AbslParseFlag(absl::string_view text, ScorerSetting* setting, std::string* error) {
  if (text == "auto") {
    *setting = ScorerSetting::kAuto;
  } else if (text == "cpu") {
    *setting = ScorerSetting::kCpu;
  } else if (text == "cuda") {
    *setting = ScorerSetting::kCuda;
  } else {
    *error = absl::StrCat("'", text, "' is not a scorer (auto, cpu, cuda)");
    return false;
  }
  return true;
}

std::string AbslUnparseFlag(ScorerSetting setting) {
  switch (setting) {
    case ScorerSetting::kCpu:
      return "cpu";
    case ScorerSetting::kCuda:
      return "cuda";
    case ScorerSetting::kAuto:
      break;
  }
  return "auto";
}

bool AbslParseFlag(absl::string_view text, UidList* uids, std::string* error) {
  UidList parsed;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    uint32_t uid = 0;
    if (!absl::SimpleAtoi(item, &uid)) {
      *error = absl::StrCat("'", item, "' is not a uid");
      return false;
    }
    parsed.push_back(static_cast<uid_t>(uid));
  }
  *uids = std::move(parsed);
  return true;
}

std::string AbslUnparseFlag(const UidList& uids) { return absl::StrJoin(uids, ","); }

bool AbslParseFlag(absl::string_view text, TenantShares* shares, std::string* error) {
  TenantShares parsed;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    const std::pair<absl::string_view, absl::string_view> pair = absl::StrSplit(item, '=');
    double share = 0.0;
    if (!absl::StrContains(item, '=') || !absl::SimpleAtod(pair.second, &share)) {
      *error = absl::StrCat("'", item, "' is not name=share");
      return false;
    }
    parsed.push_back({std::string(absl::StripAsciiWhitespace(pair.first)), share});
  }
  *shares = std::move(parsed);
  return true;
}

std::string AbslUnparseFlag(const TenantShares& shares) {
  return absl::StrJoin(shares, ",", [](std::string* out, const TenantShare& tenant) {
    absl::StrAppend(out, tenant.name, "=", tenant.share);
  });
}

std::string AbslUnparseFlag(ScopeSetting setting) {
  switch (setting) {
    case ScopeSetting::kGroup:
      return "group";
    case ScopeSetting::kLayer:
      return "layer";
    case ScopeSetting::kAuto:
      break;
  }
  return "auto";
}

}  // namespace entrokv::service

#define ENTROKV_DEFINE_OPTION_FLAG(type, name, default_value, help) \
  ABSL_FLAG(type, name, default_value, help);
ENTROKV_SERVER_OPTIONS(ENTROKV_DEFINE_OPTION_FLAG)
#undef ENTROKV_DEFINE_OPTION_FLAG

ABSL_FLAG(std::string, config, "",
          "Flagfile read before the command line (one --name=value per line); flags given on "
          "the command line win");

namespace entrokv::service {

ServerOptions OptionsFromFlags() {
  ServerOptions options;
#define ENTROKV_COPY_OPTION_FLAG(type, name, default_value, help) \
  options.name = absl::GetFlag(FLAGS_##name);
  ENTROKV_SERVER_OPTIONS(ENTROKV_COPY_OPTION_FLAG)
#undef ENTROKV_COPY_OPTION_FLAG
  return options;
}

std::vector<std::string> ConfigFiles(const std::vector<std::string>& argv) {
  std::vector<std::string> files;
  for (size_t i = 1; i < argv.size(); ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (!absl::ConsumePrefix(&arg, "--")) absl::ConsumePrefix(&arg, "-");
    if (arg == "config" && i + 1 < argv.size()) {
      files.push_back(argv[i + 1]);
    } else if (absl::ConsumePrefix(&arg, "config=")) {
      files.emplace_back(arg);
    }
  }
  return files;
}

std::vector<std::string> ExpandConfigFlag(const std::vector<std::string>& argv) {
  if (argv.empty()) return argv;
  std::vector<std::string> expanded = {argv.front()};
  for (const std::string& file : ConfigFiles(argv)) {
    if (!file.empty()) expanded.push_back(absl::StrCat("--flagfile=", file));
  }
  expanded.insert(expanded.end(), argv.begin() + 1, argv.end());
  return expanded;
}

void ConfigureFlagsUsage() {
  absl::FlagsUsageConfig config;
  const auto ours = [](absl::string_view file) { return absl::EndsWith(file, "service/flags.cc"); };
  config.contains_help_flags = ours;
  config.contains_helpshort_flags = ours;
  absl::SetFlagsUsageConfig(config);
}

}  // namespace entrokv::service
