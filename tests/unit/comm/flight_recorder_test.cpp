// The flight recorder on real thread-rank Comms (comm/flight_recorder.h), and the hang analysis
// (comm/flight_analysis.h) on records built the way ranks write them.
#include "comm/flight_recorder.h"

#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "comm/flight_analysis.h"
#include "common/error.h"

namespace ds::rt::comm {
namespace {

using nlohmann::json;

// The entries of `snap` on the group named `name` whose rank is `rank`.
std::vector<json> entries_of(const json& snap, const std::string& name, int rank) {
  std::vector<json> out;
  for (const auto& e : snap["entries"]) {
    const auto& g = snap["groups"][e["group"].get<size_t>()];
    if (g["name"] == name && g["rank"] == rank) out.push_back(e);
  }
  return out;
}

TEST(FlightRecorder, RecordsEveryOperationWithItsSequenceNumberAndState) {
  ASSERT_TRUE(flight::enabled());
  CommOptions o;
  o.name = "fr_test";
  o.backend = Backend::kShm;
  auto comms = make_thread_comms(2, o);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r) {
    ts.emplace_back([&, r] {
      Comm& c = *comms[static_cast<size_t>(r)];
      std::vector<float> buf(1000, 1.0f);
      c.all_reduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum);
      c.broadcast(buf.data(), 10, DataType::kFloat32, 1);
      if (r == 0) {
        c.send(buf.data(), 7, DataType::kFloat32, 1, 5);
      } else {
        c.recv(buf.data(), 7, DataType::kFloat32, 0, 5);
      }
      auto w = c.all_reduce_async(buf.data(), 3, DataType::kFloat32, ReduceOp::kMax);
      w->wait();
    });
  }
  for (auto& t : ts) t.join();
  const json snap = flight::snapshot("test");
  EXPECT_EQ(snap["format"], "dstrain-flight-recorder");
  for (int r = 0; r < 2; ++r) {
    const auto es = entries_of(snap, "fr_test", r);
    ASSERT_EQ(es.size(), 4u) << snap.dump(1);
    EXPECT_EQ(es[0]["op"], "all_reduce");
    EXPECT_EQ(es[0]["seq"], 1);
    EXPECT_EQ(es[0]["elements"], 1000);
    EXPECT_EQ(es[0]["bytes"], 4000);
    EXPECT_EQ(es[0]["reduce"], "sum");
    EXPECT_EQ(es[1]["op"], "broadcast");
    EXPECT_EQ(es[1]["seq"], 2);
    EXPECT_EQ(es[1]["root"], 1);
    EXPECT_EQ(es[2]["op"], r == 0 ? "send" : "recv");
    EXPECT_EQ(es[2]["seq"], 1);  // the first of its kind, peer and tag
    EXPECT_EQ(es[2]["peer"], 1 - r);
    EXPECT_EQ(es[2]["tag"], 5);
    EXPECT_EQ(es[3]["seq"], 3);
    EXPECT_EQ(es[3]["reduce"], "max");
    for (const auto& e : es) {
      EXPECT_EQ(e["state"], "completed") << e.dump();
      EXPECT_GT(e["issued_us"].get<int64_t>(), 0);
      EXPECT_GE(e["started_us"].get<int64_t>(), e["issued_us"].get<int64_t>());
      EXPECT_GE(e["ended_us"].get<int64_t>(), e["started_us"].get<int64_t>());
    }
  }
}

TEST(FlightRecorder, AFailedOperationIsRecordedAndDumpedWithItsError) {
  const auto dir = std::filesystem::temp_directory_path() / "dstrain_fr_dump";
  std::filesystem::remove_all(dir);
  ::setenv("DSTRAIN_FLIGHT_DIR", dir.c_str(), 1);
  ::setenv("RANK", "0", 1);
  CommOptions o;
  o.name = "fr_fail";
  o.backend = Backend::kShm;
  o.timeout = Millis(300);
  auto comms = make_thread_comms(2, o);
  std::vector<float> buf(4, 1.0f);
  EXPECT_THROW(comms[0]->all_reduce(buf.data(), buf.size(), DataType::kFloat32, ReduceOp::kSum), Error);
  const auto es = entries_of(flight::snapshot("test"), "fr_fail", 0);
  ASSERT_EQ(es.size(), 1u);
  EXPECT_EQ(es[0]["state"], "failed");
  EXPECT_NE(es[0]["error"].get<std::string>().find("all_reduce on group 'fr_fail'"), std::string::npos);
  comms.clear();
  // The first failure dumped the record, atomically, under the rank's number.
  std::ifstream in(dir / "flight_0.json");
  ASSERT_TRUE(in.good());
  const json dumped = json::parse(in);
  EXPECT_NE(dumped["reason"].get<std::string>().find("comm failure: all_reduce on group 'fr_fail'"), std::string::npos);
  EXPECT_FALSE(entries_of(dumped, "fr_fail", 0).empty());
  ::unsetenv("DSTRAIN_FLIGHT_DIR");
  ::unsetenv("RANK");
  std::filesystem::remove_all(dir);
}

// ---------------------------------------------------------------- the analysis

json group(const std::string& name, int rank, std::vector<int> world_ranks) {
  const int size = static_cast<int>(world_ranks.size());
  return {{"name", name}, {"rank", rank}, {"size", size}, {"backend", "shm"}, {"world_ranks", world_ranks}};
}
json entry(int g, uint64_t seq, const std::string& op, const std::string& state, uint64_t elements = 1024) {
  return {{"id", seq}, {"group", g}, {"seq", seq}, {"op", op}, {"dtype", "fp32"}, {"elements", elements},
          {"state", state}, {"issued_us", 1}, {"started_us", 1}, {"ended_us", 0}};
}
json record(int world_rank, json groups, json entries) {
  return {{"format", "dstrain-flight-recorder"}, {"version", 1}, {"world_rank", world_rank},
          {"groups", std::move(groups)}, {"entries", std::move(entries)}};
}

TEST(HangAnalysis, NamesTheRankThatNeverIssuedTheCollectiveTheOthersWaitIn) {
  std::vector<json> dumps;
  std::vector<std::string> names;
  for (int r = 0; r < 4; ++r) {
    json es = json::array({entry(0, 41, "all_reduce", "completed")});
    if (r != 2) es.push_back(entry(0, 42, "all_gather", "failed", 4096));
    dumps.push_back(record(r, json::array({group("world", r, {0, 1, 2, 3})}), es));
    names.push_back("flight_" + std::to_string(r) + ".json");
  }
  const auto a = flight::analyse_hang(dumps, names);
  EXPECT_EQ(a.behind, std::vector<int>{2});
  ASSERT_EQ(a.findings.size(), 1u);
  EXPECT_NE(a.findings[0].text.find("ranks 0, 1, 3 wait in #42 all_gather (fp32 x 4096) (and gave up: failed); rank 2 "
                                    "has not issued #42 (its last is #41 all_reduce (fp32 x 1024), completed)"),
            std::string::npos)
      << a.findings[0].text;
  EXPECT_NE(a.verdict.find("rank 2 is behind"), std::string::npos) << a.verdict;
}

// Post-mortem records of rank 2 stopped in a ring attention (cp group {2, 3}) and let run again at
// the teardown: it went on to a later send. Rank 3 never reached the world's next collective and
// never posted that recv, but it waits itself (it gave up on its recv from rank 2): it is named
// with where it waits. Both 2 and 3 wait somewhere, so the sequence numbers name both; the ranks'
// beacon verdict (hung_peers) settles it.
TEST(HangAnalysis, ARankThatWaitsElsewhereIsNotTheOneBehind) {
  auto p2p = [](int g, uint64_t seq, const std::string& op, const std::string& state, int peer) {
    return json({{"id", seq}, {"group", g}, {"seq", seq}, {"op", op}, {"dtype", "fp32"}, {"elements", 512},
                 {"state", state}, {"peer", peer}, {"tag", 7102}});
  };
  std::vector<json> dumps;
  for (int r : {0, 1}) {
    dumps.push_back(record(r, json::array({group("world", r, {0, 1, 2, 3})}),
                           json::array({entry(0, 13, "all_gather", "completed"), entry(0, 14, "all_reduce", "failed")})));
  }
  dumps.push_back(record(2, json::array({group("world", 2, {0, 1, 2, 3}), group("cp1", 0, {2, 3})}),
                         json::array({entry(0, 13, "all_gather", "completed"), p2p(1, 33, "send", "completed", 1),
                                      p2p(1, 34, "send", "started", 1)})));
  dumps.push_back(record(3, json::array({group("world", 3, {0, 1, 2, 3}), group("cp1", 1, {2, 3})}),
                         json::array({entry(0, 13, "all_gather", "completed"), p2p(1, 33, "recv", "failed", 0)})));
  auto a = flight::analyse_hang(dumps, {"0", "1", "2", "3"});
  const std::string report = flight::format_hang_report(a, "d");
  EXPECT_NE(report.find("rank 3 has not issued #14 (its last is #13 all_gather (fp32 x 1024), completed; it waits in "
                        "recv #33 on group 'cp1')"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("rank 3 waits in its recv #33 (state failed)"), std::string::npos) << report;
  EXPECT_EQ(a.behind, (std::vector<int>{2, 3})) << report;
  dumps[0]["hung_peers"] = json::array({{{"world_rank", 2}, {"what", "made no progress"}}});
  a = flight::analyse_hang(dumps, {"0", "1", "2", "3"});
  EXPECT_EQ(a.behind, std::vector<int>{2});
}

TEST(HangAnalysis, AMissingRecordAndTheRanksVerdictsNameTheStoppedRank) {
  std::vector<json> dumps;
  std::vector<std::string> names;
  for (int r : {0, 1, 3}) {
    json d = record(r, json::array({group("world", r, {0, 1, 2, 3})}),
                    json::array({entry(0, 7, "all_reduce", "failed")}));
    d["hung_peers"] = json::array({{{"world_rank", 2}, {"what", "made no progress"}}});
    dumps.push_back(d);
    names.push_back("f" + std::to_string(r));
  }
  const auto a = flight::analyse_hang(dumps, names);
  EXPECT_EQ(a.ranks_missing, std::vector<int>{2});
  EXPECT_EQ(a.behind, std::vector<int>{2});
  const std::string report = flight::format_hang_report(a, "logs");
  EXPECT_NE(report.find("rank 2 left no flight record"), std::string::npos) << report;
  EXPECT_NE(report.find("ranks 0, 1, 3 saw rank 2 make no progress"), std::string::npos) << report;
}

TEST(HangAnalysis, FindsMismatchedCollectivesAndUnmatchedReceives) {
  // Group 'pp' of world ranks 4 and 5: rank 5 waits in its 3rd recv from rank 4 (tag 1), which
  // has sent only two; and 'world' ranks disagree on #9.
  std::vector<json> dumps = {
      record(4, json::array({group("pp", 0, {4, 5}), group("world", 0, {4, 5})}),
             json::array({entry(1, 9, "all_reduce", "completed"),
                          json({{"id", 1}, {"group", 0}, {"seq", 2}, {"op", "send"}, {"dtype", "bf16"},
                                {"elements", 64}, {"state", "completed"}, {"peer", 1}, {"tag", 1}})})),
      record(5, json::array({group("pp", 1, {4, 5}), group("world", 1, {4, 5})}),
             json::array({entry(1, 9, "broadcast", "completed"),
                          json({{"id", 2}, {"group", 0}, {"seq", 3}, {"op", "recv"}, {"dtype", "bf16"},
                                {"elements", 64}, {"state", "started"}, {"peer", 0}, {"tag", 1}})}))};
  const auto a = flight::analyse_hang(dumps, {"a", "b"});
  const std::string report = flight::format_hang_report(a, "d");
  EXPECT_NE(report.find("mismatched collectives at #9: rank 4 issued all_reduce (fp32 x 1024), rank 5 issued "
                        "broadcast"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("rank 5 waits in recv #3 from rank 4 (tag 1, bf16 x 64); rank 4 has not posted the "
                        "matching send (its last send to rank 5 with tag 1 is #2)"),
            std::string::npos)
      << report;
  EXPECT_EQ(a.behind, std::vector<int>{4});
}

TEST(HangAnalysis, BadRecordsAreNamed) {
  try {
    flight::analyse_hang({json{{"format", "other"}}}, {"logs/flight_3.json"});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("logs/flight_3.json: not a dstrain flight record"), std::string::npos);
  }
  try {
    flight::analyse_hang({record(0, json::array(), json::array({entry(3, 1, "barrier", "completed")}))}, {"f0"});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f0: entry 1 names group 3, but the record lists 0 group(s)"),
              std::string::npos)
        << e.what();
  }
  const auto dir = std::filesystem::temp_directory_path() / "dstrain_fr_empty";
  std::filesystem::create_directories(dir);
  EXPECT_THROW(flight::analyse_hang_dir(dir.string()), Error);
  std::ofstream(dir / "flight_0.json") << "{not json";
  try {
    flight::analyse_hang_dir(dir.string());
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("flight_0.json: not valid JSON"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ds::rt::comm
