// The metrics figure, parsed back as XML: one polyline per series per run, in the run's colour,
// points in step order, the legend's labels and the axes' labels present.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "plot/figure.h"
#include "plot_test_util.h"

namespace ds::plot {
namespace {

using test::ScratchDir;

bool has_text(const nlohmann::json& svg, const std::string& text) {
  for (const auto& t : svg["texts"])
    if (t.get<std::string>() == text) return true;
  return false;
}

class PlotFigure : public ::testing::Test {
 protected:
  void SetUp() override {
    test::write(dir_.file("fp32.jsonl"), test::synthetic_run(20, 5.0));
    test::write(dir_.file("bf16.jsonl"), test::synthetic_run(12, 5.5));
    runs_.push_back(read_metrics_file(dir_.file("fp32.jsonl")));
    runs_.push_back(read_metrics_file(dir_.file("bf16.jsonl")));
    runs_[1].label = "bf16 <&> run";
  }
  nlohmann::json draw() {
    test::write(dir_.file("out.svg"), metrics_figure_svg(runs_));
    return test::parse_svg(dir_.file("out.svg"), dir_);
  }
  ScratchDir dir_;
  std::vector<MetricsRun> runs_;
};

TEST_F(PlotFigure, OnePolylinePerSeriesPerRun) {
  auto svg = draw();
  ASSERT_EQ(svg["root"], "svg");
  // Per run: loss, val_loss, lr, tokens_per_s, peak params, peak total (comm is 0 throughout).
  std::map<std::string, int> per_colour;
  for (const auto& p : svg["polylines"]) per_colour[p["stroke"].get<std::string>()]++;
  EXPECT_EQ(svg["polylines"].size(), 12u);
  EXPECT_EQ(per_colour[run_colour(0)], 6);
  EXPECT_EQ(per_colour[run_colour(1)], 6);
  EXPECT_EQ(svg["circles"].get<int>(), 4 + 2 + 1);  // val points (4 and 2) and the legend's marker
}

TEST_F(PlotFigure, PointsAreInStepOrder) {
  auto svg = draw();
  for (const auto& p : svg["polylines"]) {
    const auto& pts = p["points"];
    for (size_t i = 1; i < pts.size(); ++i) {
      EXPECT_GT(pts[i][0].get<double>(), pts[i - 1][0].get<double>()) << p.dump();
    }
  }
  // The two runs' loss lines start at the same x (step 1) and the shorter one ends earlier.
  std::vector<nlohmann::json> loss;
  for (const auto& p : svg["polylines"])
    if (p["points"].size() == 20 || p["points"].size() == 12) loss.push_back(p["points"]);
  ASSERT_GE(loss.size(), 2u);
  EXPECT_DOUBLE_EQ(loss[0][0][0].get<double>(), loss[1][0][0].get<double>());
  EXPECT_GT(loss[0].back()[0].get<double>(), loss[1].back()[0].get<double>());
}

TEST_F(PlotFigure, LegendAndAxisLabels) {
  auto svg = draw();
  for (const char* t :
       {"fp32", "bf16 <&> run", "train loss", "val loss", "loss", "loss (nats)", "lr", "tokens/s",
        "MiB", "step", "learning rate", "throughput", "peak memory: params", "peak memory: total",
        "peak memory not drawn (0 at every step): comm"}) {
    EXPECT_TRUE(has_text(svg, t)) << t;
  }
  EXPECT_FALSE(has_text(svg, "peak memory: comm"));
  // Tick labels at round values: the step axis of the small panels.
  for (const char* t : {"0", "5", "10", "15", "20"}) EXPECT_TRUE(has_text(svg, t)) << t;
}

TEST_F(PlotFigure, PanelsWithoutDataAreLeftOut) {
  test::write(dir_.file("loss_only.jsonl"), "{\"step\":1,\"loss\":2}\n{\"step\":2,\"loss\":1.5}\n");
  runs_ = {read_metrics_file(dir_.file("loss_only.jsonl"))};
  auto svg = draw();
  EXPECT_EQ(svg["polylines"].size(), 1u);
  EXPECT_FALSE(has_text(svg, "learning rate"));
  EXPECT_FALSE(has_text(svg, "val loss"));
  EXPECT_TRUE(has_text(svg, "loss (nats)"));
}

TEST_F(PlotFigure, EvalTasksGetAPanelEach) {
  test::write(dir_.file("eval.jsonl"),
              "{\"step\":1,\"loss\":2}\n"
              "{\"step\":2,\"loss\":1.5,\"eval_hellaswag_acc\":0.3,\"eval_hellaswag_acc_norm\":0.35,"
              "\"eval_lambada_acc\":0.2,\"eval_lambada_ppl\":40}\n"
              "{\"step\":3,\"loss\":1.4}\n"
              "{\"step\":4,\"loss\":1.3,\"eval_hellaswag_acc\":0.4,\"eval_hellaswag_acc_norm\":0.45,"
              "\"eval_lambada_acc\":0.3,\"eval_lambada_ppl\":30}\n");
  runs_ = {read_metrics_file(dir_.file("eval.jsonl"))};
  auto svg = draw();
  for (const char* t : {"eval: hellaswag", "eval: lambada", "eval: lambada perplexity", "accuracy", "ppl"}) {
    EXPECT_TRUE(has_text(svg, t)) << t;
  }
  EXPECT_FALSE(has_text(svg, "eval: hellaswag perplexity"));  // no ppl for HellaSwag: left out
  // loss, and per task its lines (hellaswag acc, acc_norm; lambada acc, ppl), two points each.
  EXPECT_EQ(svg["polylines"].size(), 5u);
  EXPECT_EQ(svg["circles"].get<int>(), 4 * 2);
}

}  // namespace
}  // namespace ds::plot
