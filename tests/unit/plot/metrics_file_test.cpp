// Reading metrics files back: what is kept, gaps, repeated steps, and every bad input's message.
#include <gtest/gtest.h>

#include "common/error.h"
#include "plot/metrics_file.h"
#include "plot_test_util.h"

namespace ds::plot {
namespace {

using test::ScratchDir;
using test::write;

std::string error_of(const std::string& path) {
  try {
    read_metrics_file(path);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    return e.what();
  }
  return "(no error)";
}

TEST(PlotMetricsFile, KeepsThePlottedFieldsInStepOrder) {
  ScratchDir dir;
  const auto path = dir.file("run.a.jsonl");
  write(path, test::synthetic_run(10, 5.0));
  auto run = read_metrics_file(path);
  EXPECT_EQ(run.label, "run.a");
  EXPECT_EQ(run.path, path);
  std::vector<std::string> fields;
  for (const auto& [k, s] : run.series) fields.push_back(k);
  EXPECT_EQ(fields, (std::vector<std::string>{"loss", "lr", "peak_bytes_comm", "peak_bytes_params",
                                              "peak_bytes_total", "tokens_per_s", "val_loss"}));
  EXPECT_EQ(run.series["loss"].steps.size(), 10u);
  EXPECT_EQ(run.series["val_loss"].steps, (std::vector<int64_t>{5, 10}));
  EXPECT_DOUBLE_EQ(run.series["loss"].values[0], 5.0 / 1.1);
}

TEST(PlotMetricsFile, NullIsAGapAndTheLastRecordOfAStepWins) {
  ScratchDir dir;
  const auto path = dir.file("resumed.jsonl");
  // Steps 1-3, then a resume from step 1's checkpoint repeats 2 and 3; a NaN loss is null.
  write(path,
        "{\"step\":1,\"loss\":3.0}\n{\"step\":2,\"loss\":2.5,\"val_loss\":2.6}\n{\"step\":3,"
        "\"loss\":null}\n"
        "\n{\"step\":2,\"loss\":2.4}\n{\"step\":3,\"loss\":2.2,\"skipped\":true}\n");
  auto run = read_metrics_file(path);
  EXPECT_EQ(run.series["loss"].steps, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(run.series["loss"].values, (std::vector<double>{3.0, 2.4, 2.2}));
  EXPECT_EQ(run.series.count("val_loss"), 0u);  // replaced with step 2's later record
}

TEST(PlotMetricsFile, RankCopiesAndOtherFieldsAreIgnored) {
  EXPECT_TRUE(is_plotted_field("peak_bytes_total"));
  EXPECT_TRUE(is_plotted_field("peak_bytes_pinned_host"));
  EXPECT_FALSE(is_plotted_field("peak_bytes_total_rank3"));
  EXPECT_FALSE(is_plotted_field("planned_bytes_total"));
  EXPECT_FALSE(is_plotted_field("grad_norm"));
  EXPECT_FALSE(is_plotted_field("peak_bytes_"));
  EXPECT_TRUE(is_plotted_field("eval_hellaswag_acc_norm"));
  EXPECT_FALSE(is_plotted_field("eval_hellaswag_acc_rank1"));
}

TEST(PlotMetricsFile, BadInputNamesTheFileAndLine) {
  ScratchDir dir;
  const auto missing = dir.file("missing.jsonl");
  EXPECT_EQ(error_of(missing),
            "cannot read metrics file " + missing + ": No such file or directory");

  const auto p = dir.file("bad.jsonl");
  write(p, "{\"step\":1,\"loss\":3}\n{\"step\":2,\"loss\":\n");
  EXPECT_EQ(error_of(p), p + ":2: not a JSON object");
  write(p, "{\"step\":1}\n[1, 2]\n");
  EXPECT_EQ(error_of(p), p + ":2: not a JSON object");
  write(p, "{\"step\":1}\n\n{\"loss\":2.0}\n");
  EXPECT_EQ(error_of(p), p + ":3: the record has no \"step\"");
  write(p, "{\"step\":-1}\n");
  EXPECT_EQ(error_of(p), p + ":1: \"step\" must be a non-negative integer, got -1");
  write(p, "{\"step\":1.5}\n");
  EXPECT_EQ(error_of(p), p + ":1: \"step\" must be a non-negative integer, got 1.5");
  write(p, "{\"step\":1,\"loss\":\"abc\"}\n");
  EXPECT_EQ(error_of(p), p + ":1: \"loss\" must be a number, got \"abc\"");
  write(p, "\n\n");
  EXPECT_EQ(error_of(p), p + ": no metrics records (the file is empty)");
}

}  // namespace
}  // namespace ds::plot
