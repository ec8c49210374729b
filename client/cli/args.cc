#include "client/cli/args.h"

#include <cmath>
#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/cli/command.h"
#include "core/util/status_macros.h"

namespace entrokv::cli {

void ArgParser::Option(const std::string& name, const std::string& default_value,
                       const std::string& help) {
  order_.push_back(name);
  specs_[name] = Spec{false, default_value, help};
}

void ArgParser::Flag(const std::string& name, bool default_value, const std::string& help) {
  order_.push_back(name);
  specs_[name] = Spec{true, default_value ? "true" : "false", help};
}

absl::StatusOr<bool> ArgParser::Parse(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(Help().c_str(), stdout);
      return false;
    }
    if (!absl::StartsWith(arg, "--")) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    arg = arg.substr(2);
    std::optional<std::string> inline_value;
    if (const size_t eq = arg.find('='); eq != std::string::npos) {
      inline_value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    }
    auto spec = specs_.find(arg);
    if (spec == specs_.end() && absl::StartsWith(arg, "no-")) {
      auto negated = specs_.find(arg.substr(3));
      if (negated != specs_.end() && negated->second.is_flag && !inline_value) {
        values_[negated->first] = "false";
        continue;
      }
    }
    if (spec == specs_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown option --", arg));
    }
    if (spec->second.is_flag) {
      if (inline_value && *inline_value != "true" && *inline_value != "false") {
        return absl::InvalidArgumentError(absl::StrCat("--", arg, " takes no value"));
      }
      values_[arg] = inline_value.value_or("true");
      continue;
    }
    if (!inline_value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("--", arg, " needs a value"));
      }
      inline_value = args[++i];
    }
    values_[arg] = *inline_value;
  }
  return true;
}

bool ArgParser::Has(const std::string& name) const {
  return Given(name) || !specs_.at(name).default_value.empty();
}

bool ArgParser::Given(const std::string& name) const { return values_.count(name) > 0; }

std::string ArgParser::Get(const std::string& name) const {
  auto value = values_.find(name);
  return value != values_.end() ? value->second : specs_.at(name).default_value;
}

bool ArgParser::GetFlag(const std::string& name) const { return Get(name) == "true"; }

absl::StatusOr<int64_t> ArgParser::GetInt(const std::string& name) const {
  int64_t value;
  if (!absl::SimpleAtoi(Get(name), &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": '", Get(name), "' is not an integer"));
  }
  return value;
}

absl::StatusOr<double> ArgParser::GetDouble(const std::string& name) const {
  const std::string text = Get(name);
  double value;
  if (text == "inf" || text == "infinity") return INFINITY;
  if (!absl::SimpleAtod(text, &value) || std::isnan(value)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": '", text, "' is not a number"));
  }
  return value;
}

std::string ArgParser::Help() const {
  std::string help = absl::StrCat("usage: entrokv ", command_, " ", synopsis_, "\n\noptions:\n");
  for (const std::string& name : order_) {
    const Spec& spec = specs_.at(name);
    std::string left = absl::StrCat("  --", name, spec.is_flag ? "" : " VALUE");
    if (left.size() < 26) left.resize(26, ' ');
    absl::StrAppend(&help, left, " ", spec.help);
    if (!spec.default_value.empty()) absl::StrAppend(&help, " (default ", spec.default_value, ")");
    absl::StrAppend(&help, "\n");
  }
  return help;
}

int UsageError(const std::string& command, const absl::Status& status) {
  std::fprintf(stderr, "entrokv %s: %s\n", command.c_str(), std::string(status.message()).c_str());
  return kExitUsage;
}

absl::Status ParseNeighbourhood(const ArgParser& parser, PolicyOptions* options) {
  ASSIGN_OR_RETURN(const int64_t kernel, parser.GetInt("neighbourhood-kernel"));
  RETURN_IF_ERROR(ValidateNeighbourhoodKernel("--neighbourhood-kernel", kernel));
  options->neighbourhood_kernel = static_cast<int>(kernel);
  ASSIGN_OR_RETURN(options->neighbourhood,
                   ParseNeighbourhoodKind("--neighbourhood", parser.Get("neighbourhood")));
  return absl::OkStatus();
}

}  // namespace entrokv::cli
