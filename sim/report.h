// Writing an evaluation to disk: the CSV files, report.md, and the matplotlib plots.
#ifndef ENTROKV_SIM_REPORT_H_
#define ENTROKV_SIM_REPORT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sim/eval.h"

namespace entrokv::sim {

// The column header of results.csv, for readers and tests.
[[nodiscard]] std::string ResultsCsvHeader();

// Writes results.csv, uor_groups.csv, heads.csv and closed_form.csv into `out_dir` (which must
// exist) and returns their names. INTERNAL when a file cannot be written.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> WriteEvalCsv(const EvalResults& results,
                                                                    const std::string& out_dir);

// report.md; `plot_note` is empty when the PNGs were drawn, else says why they are missing.
[[nodiscard]] absl::Status WriteReportMarkdown(const EvalResults& results,
                                               const EvalOptions& options,
                                               const std::string& plot_note,
                                               const std::string& out_dir);

// The PNG names eval_plots.py draws.
[[nodiscard]] std::vector<std::string> PlotFiles();

// Runs `python plot_script --out out_dir` and waits. FAILED_PRECONDITION with the exit status
// when it cannot start or fails.
[[nodiscard]] absl::Status RunPlotScript(const std::string& python, const std::string& script,
                                         const std::string& out_dir);

// The plot script's file name; DefaultPlotScript() looks for it beside the running binary, then in
// <binary>/../share/entrokv/ (an installed tree); the first candidate when neither exists.
inline constexpr char kPlotScriptName[] = "eval_plots.py";
[[nodiscard]] std::string DefaultPlotScript();

}  // namespace entrokv::sim

#endif  // ENTROKV_SIM_REPORT_H_
