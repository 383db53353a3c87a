// Line splitting, rank sets and the output multiplexer (console through pipes, log files).
#include "launch/output.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "common/error.h"

namespace ds::launch {
namespace {

std::vector<std::string> split_all(const std::vector<std::string>& chunks, bool finish) {
  LineSplitter s;
  std::vector<std::string> out;
  auto sink = [&](std::string_view l) { out.emplace_back(l); };
  for (const auto& c : chunks) s.feed(c, sink);
  if (finish) s.finish(sink);
  return out;
}

TEST(LineSplitter, JoinsChunksIntoLines) {
  EXPECT_EQ(split_all({"a", "b\nc", "d\n\nlast"}, false),
            (std::vector<std::string>{"ab", "cd", ""}));
  EXPECT_EQ(split_all({"a", "b\nc", "d\n\nlast"}, true),
            (std::vector<std::string>{"ab", "cd", "", "last"}));
  EXPECT_EQ(split_all({"x\r\n"}, true), (std::vector<std::string>{"x\r"}));
}

TEST(LineSplitter, BoundsAnEndlessLine) {
  std::string big(LineSplitter::kMaxLine * 2 + 10, 'x');
  auto lines = split_all({big}, true);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].size(), LineSplitter::kMaxLine);
  EXPECT_EQ(lines[2].size(), 10u);
}

TEST(RankSet, ParsesListsAndRanges) {
  EXPECT_EQ(parse_rank_set("0,2-4, 7", 8, "--ranks-filter"), (std::set<int>{0, 2, 3, 4, 7}));
  for (const char* bad : {"8", "-1", "a", "3-1", "1,,2", ""}) {
    try {
      parse_rank_set(bad, 8, "--ranks-filter");
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--ranks-filter"), std::string::npos) << e.what();
    }
  }
}

std::string drain(int fd) {
  std::string s;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) s.append(buf, static_cast<size_t>(n));
  return s;
}

TEST(OutputMux, PrefixesFiltersAndLogs) {
  int out[2], err[2];
  ASSERT_EQ(::pipe2(out, O_NONBLOCK), 0);
  ASSERT_EQ(::pipe2(err, O_NONBLOCK), 0);
  char tmpl[] = "/tmp/ds_mux_XXXXXX";
  std::string dir = ::mkdtemp(tmpl);
  {
    OutputOptions o;
    o.console_ranks = std::set<int>{1};
    o.log_dir = dir + "/logs";
    OutputMux mux(o, out[1], err[1]);
    mux.line(0, 1, "hidden on the console");
    mux.line(1, 1, "hello");
    mux.line(1, 2, "oops");
    mux.restart_marker(1);
    mux.note("dstrain: summary");
  }
  EXPECT_EQ(drain(out[0]), "[rank 1] hello\n");
  EXPECT_EQ(drain(err[0]), "[rank 1] oops\ndstrain: summary\n");
  std::ifstream l0(dir + "/logs/rank_0.log"), l1(dir + "/logs/rank_1.log");
  std::stringstream s0, s1;
  s0 << l0.rdbuf();
  s1 << l1.rdbuf();
  EXPECT_EQ(s0.str(), "hidden on the console\n----- dstrain: restart 1 -----\n");
  EXPECT_EQ(s1.str(), "hello\noops\n----- dstrain: restart 1 -----\n");
  for (int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ds::launch
