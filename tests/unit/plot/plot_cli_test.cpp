// `dstrain plot` through the real binary: the default output, --label, PNG through rsvg-convert,
// and the exact errors for bad input, a bad output name and a missing or failing rsvg-convert.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include "plot_test_util.h"

namespace ds::plot {
namespace {

using ds::test::dstrain;
using ds::test::run_command;
using test::ScratchDir;

bool has_text(const nlohmann::json& svg, const std::string& text) {
  for (const auto& t : svg["texts"])
    if (t.get<std::string>() == text) return true;
  return false;
}

class PlotCli : public ::testing::Test {
 protected:
  void SetUp() override {
    test::write(dir_.file("a.jsonl"), test::synthetic_run(10, 5.0));
    test::write(dir_.file("b.jsonl"), test::synthetic_run(10, 4.0));
  }
  // Runs dstrain plot in the scratch directory.
  ds::test::CommandResult plot(const std::string& args, const std::string& env = "") {
    return run_command("cd " + dir_.path() + " && " + env + " " + dstrain() + " plot " + args);
  }
  ScratchDir dir_;
};

TEST_F(PlotCli, WritesPlotSvgByDefaultWithStemLabels) {
  auto r = plot("a.jsonl b.jsonl");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "wrote plot.svg (2 runs)\n");
  auto svg = test::parse_svg(dir_.file("plot.svg"), dir_);
  EXPECT_EQ(svg["polylines"].size(), 12u);
  EXPECT_TRUE(has_text(svg, "a"));
  EXPECT_TRUE(has_text(svg, "b"));
}

TEST_F(PlotCli, LabelsOverrideInOrder) {
  auto r = plot("a.jsonl b.jsonl --label fp32 -o out.svg");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto svg = test::parse_svg(dir_.file("out.svg"), dir_);
  EXPECT_TRUE(has_text(svg, "fp32"));
  EXPECT_TRUE(has_text(svg, "b"));
  EXPECT_FALSE(has_text(svg, "a"));
  r = plot("a.jsonl --label x --label y");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "dstrain: error: --label given 2 times for 1 metrics file\n");
}

TEST_F(PlotCli, PngThroughRsvgConvert) {
  if (run_command("command -v rsvg-convert").exit_code != 0) {
    GTEST_SKIP() << "rsvg-convert is not installed (librsvg2-bin)";
  }
  auto r = plot("a.jsonl b.jsonl -o out.png");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "wrote out.png (2 runs)\n");
  const std::string png = ds::test::read_file(dir_.file("out.png"));
  ASSERT_GT(png.size(), 8u);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
}

TEST_F(PlotCli, PngWithoutRsvgConvertSaysWhatToInstall) {
  auto r = plot("a.jsonl -o out.png", "PATH=/nonexistent");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err,
            "dstrain: error: writing out.png needs rsvg-convert, which is not on PATH\n"
            "hint: install librsvg2-bin (scripts/install-deps.sh), or write an SVG: -o plot.svg\n");
}

TEST_F(PlotCli, FailingRsvgConvertIsAnErrorWithItsMessage) {
  const std::string bin = dir_.file("bin");
  mkdir(bin.c_str(), 0755);
  test::write(bin + "/rsvg-convert", "#!/bin/sh\necho 'cannot render: out of luck' >&2\nexit 3\n");
  chmod((bin + "/rsvg-convert").c_str(), 0755);
  auto r = plot("a.jsonl -o out.png", "PATH=" + bin + ":/usr/bin:/bin");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err,
            "dstrain: error: rsvg-convert failed writing out.png (exit code 3): cannot render: out "
            "of luck\n");
}

TEST_F(PlotCli, BadInputIsAnErrorNamingFileAndLine) {
  test::write(dir_.file("bad.jsonl"), "{\"step\":1,\"loss\":3}\nnot json\n");
  auto r = plot("a.jsonl bad.jsonl");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err,
            "dstrain: error: bad.jsonl:2: not a JSON object\n"
            "hint: a metrics file holds one JSON object per line, as `dstrain train --metrics "
            "FILE` writes\n");
  test::write(dir_.file("nostep.jsonl"), "{\"loss\":3}\n");
  r = plot("nostep.jsonl");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err.substr(0, r.err.find('\n')),
            "dstrain: error: nostep.jsonl:1: the record has no \"step\"");
  r = plot("missing.jsonl");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err,
            "dstrain: error: cannot read metrics file missing.jsonl: No such file or directory\n"
            "hint: give the file `dstrain train --metrics FILE` wrote\n");
  struct stat st {};
  EXPECT_NE(stat(dir_.file("plot.svg").c_str(), &st), 0);  // nothing written on an error
}

TEST_F(PlotCli, OutputMustBeSvgOrPng) {
  auto r = plot("a.jsonl -o out.pdf");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err,
            "dstrain: error: -o out.pdf: the output must end in .svg or .png\n"
            "hint: -o plot.svg (our own SVG) or -o plot.png (through rsvg-convert)\n");
  r = plot("a.jsonl -o /nonexistent/dir/out.svg");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err,
            "dstrain: error: cannot write /nonexistent/dir/out.svg: No such file or directory\n");
}

}  // namespace
}  // namespace ds::plot
