// Line splitting, rank sets, the output multiplexer (console through pipes, log files) and the
// job summary line.
#include "launch/output.h"

#include <fcntl.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "common/error.h"
#include "launch/job_summary.h"

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

// The summary line and exit status of each way a job ends (job_summary.h).
std::string summary_of(const JobOutcome& o, int* status) {
  int err[2];
  EXPECT_EQ(::pipe2(err, O_NONBLOCK), 0);
  {
    OutputMux mux(OutputOptions{}, 1, err[1]);
    *status = finish(mux, o);
  }
  std::string s = drain(err[0]);
  ::close(err[0]);
  ::close(err[1]);
  return s;
}

TEST(JobSummary, ARankKilledWhileTheLauncherIsSignalledIsAnInterruption) {
  JobOutcome o;
  o.world_size = 4;
  o.failure = Failure{0, "n1", ExitStatus{0, SIGTERM}, {}};
  o.stop_signal = SIGTERM;  // Slurm's requeue signals the ranks and the launcher moments apart
  int status = 0;
  EXPECT_EQ(summary_of(o, &status),
            "dstrain: job interrupted by SIGTERM: every rank was stopped (rank 0 on n1 was killed by signal 15 "
            "(SIGTERM) first); exit status 143\n");
  EXPECT_EQ(status, 143);
  // A rank that crashed on its own stays the failure, signal or not.
  o.failure = Failure{2, "n2", ExitStatus{0, SIGSEGV}, {}};
  EXPECT_NE(summary_of(o, &status).find("dstrain: job failed: rank 2 on n2 was killed by signal 11 (SIGSEGV)"),
            std::string::npos);
  EXPECT_EQ(status, 128 + SIGSEGV);
  o.failure = Failure{1, "n1", ExitStatus{3, 0}, {}};
  EXPECT_NE(summary_of(o, &status).find("dstrain: job failed: rank 1 on n1 exited with exit code 3"),
            std::string::npos);
  EXPECT_EQ(status, 3);
  // A SIGTERM death without the launcher being signalled is a failure.
  o.failure = Failure{0, "n1", ExitStatus{0, SIGTERM}, {}};
  o.stop_signal = 0;
  EXPECT_NE(summary_of(o, &status).find("dstrain: job failed: rank 0 on n1 was killed by signal 15"),
            std::string::npos);
  EXPECT_EQ(status, 143);
}

TEST(HungRankLine, RoundTripsAndRejectsOtherLines) {
  const rank_lines::HungRank r{2, "node-b", "made no progress for 4.0 s while world rank 0 waited for it in all_reduce"};
  const auto back = rank_lines::parse_hung_line(rank_lines::hung_line(r));
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->world_rank, 2);
  EXPECT_EQ(back->host, "node-b");
  EXPECT_EQ(back->what, r.what);
  for (const char* bad : {"dstrain-hung-rank: x node what", "dstrain-hung-rank: 2", "dstrain-hung-rank: -1 h w",
                          "hung-rank: 2 h w", "dstrain-hung-rank: 2 nodeonly"}) {
    EXPECT_FALSE(rank_lines::parse_hung_line(bad).has_value()) << bad;
  }
}

TEST(RankLines, TheFailedStepIsTheHighestOneOfTheGenerationAndStaysOffTheConsole) {
  EXPECT_EQ(rank_lines::parse_step_line(rank_lines::step_line(27)), std::optional<int64_t>(27));
  for (const char* bad : {"dstrain-failed-at-step: ", "dstrain-failed-at-step: 12x", "dstrain-failed-at-step: -3",
                          "failed-at-step: 3"}) {
    EXPECT_FALSE(rank_lines::parse_step_line(bad).has_value()) << bad;
  }
  int err[2];
  ASSERT_EQ(::pipe2(err, O_NONBLOCK), 0);
  {
    OutputMux mux(OutputOptions{}, 1, err[1]);
    EXPECT_FALSE(mux.failed_at_step().has_value());
    mux.line(0, 2, rank_lines::step_line(16));
    mux.line(1, 2, rank_lines::step_line(17));
    mux.line(2, 2, rank_lines::step_line(16));
    mux.line(3, 1, rank_lines::step_line(99));  // stdout: not the protocol
    EXPECT_EQ(mux.failed_at_step(), std::optional<int64_t>(17));
    mux.restart_marker(1);
    EXPECT_FALSE(mux.failed_at_step().has_value());
  }
  const std::string s = drain(err[0]);
  ::close(err[0]);
  ::close(err[1]);
  EXPECT_EQ(s, "");
}

// A hang's first rank to exit is a waiting rank; the summary names the hung rank that a rank's
// hung-rank line named (the line itself stays off the console), and keeps the exit status.
TEST(JobSummary, NamesTheHungRankRatherThanTheFirstToExit) {
  int err[2];
  ASSERT_EQ(::pipe2(err, O_NONBLOCK), 0);
  JobOutcome o;
  o.world_size = 4;
  o.failure = Failure{1, "n1", ExitStatus{124, 0}, {}};
  int status = 0;
  {
    OutputMux mux(OutputOptions{}, 1, err[1]);
    mux.line(0, 2, rank_lines::hung_line({2, "n2", "made no progress for 4.0 s while world rank 0 waited for it in all_reduce"}));
    mux.line(3, 2, rank_lines::hung_line({1, "n1", "a later, second opinion"}));
    status = finish(mux, o);
  }
  const std::string s = drain(err[0]);
  ::close(err[0]);
  ::close(err[1]);
  EXPECT_EQ(status, 124);
  EXPECT_EQ(s.find("dstrain-hung-rank"), std::string::npos) << s;
  EXPECT_NE(s.find("dstrain: job failed: rank 2 on n2 hung: it made no progress for 4.0 s while world rank 0 waited "
                   "for it in all_reduce (the first rank to end: rank 1 on n1 exited with exit code 124;"),
            std::string::npos)
      << s;
  // A restart forgets the generation's hung rank.
  OutputMux mux(OutputOptions{}, 1, 1);
  mux.line(0, 2, rank_lines::hung_line({2, "n2", "x"}));
  ASSERT_TRUE(mux.hung_rank().has_value());
  mux.restart_marker(1);
  EXPECT_FALSE(mux.hung_rank().has_value());
}

}  // namespace
}  // namespace ds::launch
