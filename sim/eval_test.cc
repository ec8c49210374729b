// The report end to end on the tiny preset: the matrix runs in seconds and its CSV holds what
#include "sim/eval.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/scoring/metrics.h"
#include "core/scoring/policy.h"
#include "core/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sim/closed_form.h"
#include "sim/report.h"

namespace entrokv::sim {
namespace {

using ::entrokv::testing::StatusIs;
using ::testing::HasSubstr;

std::string TempDir(const std::string& name) {
  const auto dir = std::filesystem::path(::testing::TempDir()) /
                   ("entrokv_eval_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  return dir.string();
}

std::vector<std::vector<std::string>> ReadCsv(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::vector<std::string>> rows;
  std::string line;
  while (std::getline(in, line)) rows.push_back(absl::StrSplit(line, ','));
  return rows;
}

double Field(const std::vector<std::string>& header, const std::vector<std::string>& row,
             const std::string& name) {
  const auto it = std::find(header.begin(), header.end(), name);
  EXPECT_NE(it, header.end()) << name;
  double value = 0.0;
  EXPECT_TRUE(absl::SimpleAtod(row[static_cast<size_t>(it - header.begin())], &value)) << name;
  return value;
}

EvalOptions TinyOptions(const std::string& out) {
  EvalOptions options;
  options.model = "tiny";
  options.tokens = 4096;  // the smallest budget at B = 64 still gives one page per layer
  options.seed = 3;
  options.out_dir = out;
  options.plots = false;
  return options;
}

TEST(EvalTest, TinyReportHasEveryCellAndPooledPoliciesAreExact) {
  const std::string out = TempDir("tiny");
  int progress_calls = 0;
  ENTROKV_ASSERT_OK_AND_ASSIGN(
      const EvalOutcome outcome,
      RunEvaluation(TinyOptions(out), [&](const EvalProgress&) { ++progress_calls; }));
  EXPECT_EQ(progress_calls, 2);  // one per layer

  const auto csv = ReadCsv((std::filesystem::path(out) / "results.csv").string());
  ASSERT_FALSE(csv.empty());
  const std::vector<std::string>& header = csv[0];
  EXPECT_EQ(absl::StrJoin(header, ","), ResultsCsvHeader());
  const size_t policies = PolicyNames().size();
  ASSERT_EQ(csv.size() - 1, policies * 5 * 4);  // policies x budgets x page sizes

  int head_independent_rows = 0;
  for (size_t i = 1; i < csv.size(); ++i) {
    const auto& row = csv[i];
    ASSERT_EQ(row.size(), header.size());
    const std::string& policy = row[3];
    const double groups = Field(header, row, "groups");
    EXPECT_EQ(groups, 2 * 2);  // layers x KV groups
    if (policy == "head_independent") {
      ++head_independent_rows;
      EXPECT_GE(Field(header, row, "uor_min"), 1.0);
      EXPECT_LE(Field(header, row, "uor_max"), 2.0);  // r = 2
      EXPECT_EQ(Field(header, row, "bound_violations"), 0);
      EXPECT_GE(Field(header, row, "kept_frames"), Field(header, row, "planned_frames"));
    } else {
      EXPECT_EQ(Field(header, row, "uor_min"), 1.0) << policy;
      EXPECT_EQ(Field(header, row, "uor_max"), 1.0) << policy;
      EXPECT_EQ(Field(header, row, "kept_frames"), Field(header, row, "planned_frames")) << policy;
      EXPECT_EQ(Field(header, row, "exact_groups"), groups) << policy;
    }
    const double mass = Field(header, row, "retained_mass");
    EXPECT_GT(mass, 0.0);
    EXPECT_LE(mass, 1.0 + 1e-6);
    // The generator has ACCUMULATED: a policy that wants it gets it; every other policy that
    // reads a statistic gets the generated LAST_ROW (snapkv's WINDOW_MEAN included).
    const std::optional<StatisticKind> wanted = (*FindPolicy(policy))->statistic();
    EXPECT_EQ(row[4], !wanted.has_value()                     ? "none"
                      : wanted == StatisticKind::kAccumulated ? "accumulated"
                                                              : "last_row")
        << policy;
  }
  EXPECT_EQ(head_independent_rows, 20);

  // r = 2: UOR = 2 / (2 - D) exactly on every measured group (docs/method.md, claim C1).
  const auto uor = ReadCsv((std::filesystem::path(out) / "uor_groups.csv").string());
  ASSERT_EQ(uor.size() - 1, 5u * 4u * 2u * 2u);
  for (size_t i = 1; i < uor.size(); ++i) {
    const double value = Field(uor[0], uor[i], "uor");
    const double disagreement = 1.0 - Field(uor[0], uor[i], "jaccard_mean");
    EXPECT_NEAR(value, 2.0 / (2.0 - disagreement), 1e-6);
  }

  std::ifstream report(std::filesystem::path(out) / "report.md");
  std::stringstream text;
  text << report.rdbuf();
  for (const char* section :
       {"## 1. Union overhead", "## 2. Needle retention", "## 3. Retained attention mass",
        "## 4. Sink masquerade", "## 5. Exactness", "## 6. Closed forms"}) {
    EXPECT_THAT(text.str(), HasSubstr(section));
  }
  EXPECT_THAT(text.str(), HasSubstr("plots: not drawn"));
}

TEST(EvalTest, ClosedFormsMatchTheMethod) {
  EvalOptions options = TinyOptions(TempDir("closed"));
  options.budgets = {0.4};
  options.page_sizes = {16};
  ENTROKV_ASSERT_OK_AND_ASSIGN(const EvalResults results, Evaluate(options, nullptr));
  bool saw_128k = false;
  for (const ClosedFormRow& row : results.closed_form) {
    if (row.check == "paper_table" && row.tokens == 131072) {
      saw_128k = true;
      EXPECT_NEAR(row.delta, 1.548e-9, 0.01e-9);  // docs/method.md, claim C10: the recomputed value
      EXPECT_DOUBLE_EQ(row.mean_closed, 0.11875);
    }
    if (row.check == "single_group") {
      EXPECT_GE(row.pooled_measured, row.pooled_bound - Float32PoolingTolerance(kNeedleMass))
          << row.r << " " << row.tokens;
      EXPECT_NEAR(row.mean_measured, row.mean_closed, 1e-4);
    }
  }
  EXPECT_TRUE(saw_128k);
}

TEST(EvalTest, SelectedPoliciesOnlyAndTheirOrder) {
  EvalOptions options = TinyOptions(TempDir("subset"));
  options.policies = {"mean", "page_entrokv"};
  options.budgets = {0.1, 0.2};
  options.page_sizes = {16};
  ENTROKV_ASSERT_OK_AND_ASSIGN(const EvalResults results, Evaluate(options, nullptr));
  ASSERT_EQ(results.rows.size(), 4u);
  EXPECT_EQ(results.rows[0].policy, "mean");
  EXPECT_EQ(results.rows[2].policy, "page_entrokv");
}

TEST(EvalTest, BadOptionsNameTheField) {
  EvalOptions options = TinyOptions(TempDir("bad"));
  options.policies = {"lru"};
  EXPECT_THAT(Evaluate(options, nullptr), StatusIs(absl::StatusCode::kNotFound, HasSubstr("lru")));
  options = TinyOptions(TempDir("bad"));
  options.budgets = {1.5};
  EXPECT_THAT(Evaluate(options, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("budgets")));
  options = TinyOptions(TempDir("bad"));
  options.trace_dir = "somewhere";
  EXPECT_THAT(Evaluate(options, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model")));
  options = TinyOptions(TempDir("bad"));
  options.reference_page_size = 0;
  EXPECT_THAT(Evaluate(options, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("reference_page_size")));
  options = TinyOptions(TempDir("bad"));
  options.model = "gpt-9";
  EXPECT_THAT(Evaluate(options, nullptr), StatusIs(absl::StatusCode::kNotFound, ::testing::_));
}

TEST(EvalTest, RunsOnATraceLikeOnTheGenerator) {
  const std::string trace_dir = TempDir("trace_in");
  WorkloadOptions workload;
  workload.tokens = 4096;
  workload.seed = 3;
  ASSERT_TRUE(WriteSyntheticTrace(trace_dir, WorkloadGenerator(*FindPreset("tiny"), workload),
                                  /*with_accumulated=*/true)
                  .ok());
  EvalOptions from_trace = TinyOptions(TempDir("trace_out"));
  from_trace.model.clear();
  from_trace.trace_dir = trace_dir;
  from_trace.closed_form_checks = false;
  EvalOptions from_generator = TinyOptions(TempDir("gen_out"));
  from_generator.closed_form_checks = false;
  ENTROKV_ASSERT_OK_AND_ASSIGN(const EvalResults a, Evaluate(from_trace, nullptr));
  ENTROKV_ASSERT_OK_AND_ASSIGN(const EvalResults b, Evaluate(from_generator, nullptr));
  ASSERT_EQ(a.rows.size(), b.rows.size());
  for (size_t i = 0; i < a.rows.size(); ++i) {
    EXPECT_EQ(a.rows[i].kept_frames, b.rows[i].kept_frames);
    EXPECT_EQ(a.rows[i].retained_mass, b.rows[i].retained_mass);
    EXPECT_EQ(a.rows[i].needle_target_rate, b.rows[i].needle_target_rate);
  }
}

TEST(EvalTest, PlotScriptDrawsEveryPng) {
  if (!std::filesystem::exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
  EvalOptions options = TinyOptions(TempDir("plots"));
  options.plots = true;
  ENTROKV_ASSERT_OK_AND_ASSIGN(const EvalOutcome outcome, RunEvaluation(options, nullptr));
  ASSERT_TRUE(outcome.plots_ok) << outcome.plot_message;
  for (const std::string& png : PlotFiles()) {
    EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(options.out_dir) / png)) << png;
  }
}

TEST(EvalTest, AFailingPlotScriptStillWritesCsvAndReport) {
  EvalOptions options = TinyOptions(TempDir("noplot"));
  options.plots = true;
  options.plot_script = "does/not/exist.py";
  options.budgets = {0.2};
  options.page_sizes = {16};
  ENTROKV_ASSERT_OK_AND_ASSIGN(const EvalOutcome outcome, RunEvaluation(options, nullptr));
  EXPECT_FALSE(outcome.plots_ok);
  EXPECT_THAT(outcome.plot_message, HasSubstr("not found"));
  EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(options.out_dir) / "results.csv"));
  EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(options.out_dir) / "report.md"));
}

// The scope analysis: layer scope keeps exactly the planned layer frames with every combine,
// group scope keeps at least as many, head_independent at least as many as group scope.
TEST(EvalTest, ScopeAnalysisKeepsThePlannedFramesInLayerScope) {
  const std::string out = TempDir("scope");
  EvalOptions options = TinyOptions(out);
  options.page_sizes = {16};
  options.closed_form_checks = false;
  ENTROKV_ASSERT_OK_AND_ASSIGN(const EvalOutcome outcome, RunEvaluation(options, nullptr));
  const EvalResults& results = outcome.results;
  // (page_entrokv, mean) x (group + 3 combines) + head_independent, per budget.
  ASSERT_EQ(results.scope_rows.size(), 9 * options.budgets.size());
  for (const ScopeRow& row : results.scope_rows) {
    SCOPED_TRACE(row.policy + " " + row.scope + " " + row.combine);
    EXPECT_EQ(row.page_size, 16);
    EXPECT_GE(row.kept_frames, row.planned_frames);
    if (row.scope == "layer") {
      EXPECT_EQ(row.kept_frames, row.planned_frames);
    }
    EXPECT_GE(row.retained_mass, 0.0);
    EXPECT_LE(row.retained_mass, 1.0);
  }
  const size_t budgets = options.budgets.size();
  for (size_t b = 0; b < budgets; ++b) {
    const ScopeRow& group = results.scope_rows[b];  // page_entrokv, group scope
    const ScopeRow& independent = results.scope_rows[8 * budgets + b];
    EXPECT_EQ(group.scope, "group");
    EXPECT_EQ(independent.policy, "head_independent");
    EXPECT_GE(independent.kept_frames, group.kept_frames);
  }
  const auto csv = ReadCsv(out + "/scope.csv");
  ASSERT_EQ(csv.size(), results.scope_rows.size() + 1);
  EXPECT_EQ(Field(csv[0], csv[1], "planned_frames"),
            static_cast<double>(results.scope_rows[0].planned_frames));
}

// The scope analysis runs at the reference page size when it is evaluated, else at the first.
TEST(EvalTest, ScopeAnalysisRunsAtTheReferencePageSize) {
  EvalOptions options = TinyOptions(TempDir("reference"));
  options.budgets = {0.2};
  options.page_sizes = {16, 32};
  options.closed_form_checks = false;
  options.reference_page_size = 32;
  ENTROKV_ASSERT_OK_AND_ASSIGN(const EvalResults results, Evaluate(options, nullptr));
  ASSERT_FALSE(results.scope_rows.empty());
  for (const ScopeRow& row : results.scope_rows) EXPECT_EQ(row.page_size, 32) << row.policy;

  options.page_sizes = {32, 8};
  options.reference_page_size = 16;
  ENTROKV_ASSERT_OK_AND_ASSIGN(const EvalResults fallback, Evaluate(options, nullptr));
  ASSERT_FALSE(fallback.scope_rows.empty());
  for (const ScopeRow& row : fallback.scope_rows) EXPECT_EQ(row.page_size, 32) << row.policy;
}

}  // namespace
}  // namespace entrokv::sim
