// The Store contract, run against every implementation: HashStore, TcpStoreClient over a real
// server on a loopback port, and PrefixStore over each.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "store/hash_store.h"
#include "store/prefix_store.h"
#include "store_test_util.h"

namespace ds::store {
namespace {

using test::connect;
using test::start_server;

struct Env {
  std::unique_ptr<TcpStoreServer> server;
  std::shared_ptr<Store> base;
  std::shared_ptr<Store> store;
  // Another handle on the same data (a second client, or the same HashStore).
  std::function<std::shared_ptr<Store>()> another;
};

Env make_env(const std::string& kind) {
  Env e;
  bool prefixed = kind.find("prefix") != std::string::npos;
  if (kind.rfind("hash", 0) == 0) {
    auto h = std::make_shared<HashStore>();
    e.base = h;
    e.another = [h] { return std::static_pointer_cast<Store>(h); };
  } else {
    e.server = start_server();
    TcpStoreServer* srv = e.server.get();
    e.base = connect(*srv);
    e.another = [srv] { return std::shared_ptr<Store>(connect(*srv)); };
  }
  e.store = e.base;
  if (prefixed) {
    e.store = std::make_shared<PrefixStore>("gen1/", e.base);
    auto inner = e.another;
    e.another = [inner] { return std::shared_ptr<Store>(std::make_shared<PrefixStore>("gen1/", inner())); };
  }
  return e;
}

class StoreSemantics : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { env_ = make_env(GetParam()); }
  Store& s() { return *env_.store; }
  Env env_;
};

TEST_P(StoreSemantics, SetGetOverwriteDeleteCount) {
  s().set("a", to_bytes("1"));
  EXPECT_EQ(to_string(s().get("a")), "1");
  s().set("a", to_bytes("two"));
  EXPECT_EQ(to_string(s().get("a")), "two");
  s().set("empty", {});
  EXPECT_TRUE(s().get("empty").empty());
  Bytes binary = {0, 1, 255, 0, 7};
  s().set("bin", binary);
  EXPECT_EQ(s().get("bin"), binary);
  EXPECT_EQ(s().num_keys(), 3);
  EXPECT_TRUE(s().check({"a", "bin"}));
  EXPECT_FALSE(s().check({"a", "nope"}));
  EXPECT_TRUE(s().check({}));
  EXPECT_TRUE(s().delete_key("a"));
  EXPECT_FALSE(s().delete_key("a"));
  EXPECT_FALSE(s().check({"a"}));
  EXPECT_EQ(s().num_keys(), 2);
}

TEST_P(StoreSemantics, AddCountsAndReadsBackAsText) {
  EXPECT_EQ(s().add("n", 5), 5);
  EXPECT_EQ(s().add("n", -2), 3);
  EXPECT_EQ(s().add("n", 0), 3);
  EXPECT_EQ(to_string(s().get("n")), "3");
  s().set("text", to_bytes("hello"));
  try {
    s().add("text", 1);
    FAIL() << "add on a non-integer value must throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("text'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not a decimal integer"), std::string::npos) << e.what();
  }
  // The store (and a TCP connection) stays usable after a refused request.
  EXPECT_EQ(s().add("n", 1), 4);
}

TEST_P(StoreSemantics, CompareSet) {
  // Absent key, empty expected: created.
  EXPECT_EQ(to_string(s().compare_set("k", {}, to_bytes("v1"))), "v1");
  EXPECT_EQ(to_string(s().get("k")), "v1");
  // Matching expected: replaced.
  EXPECT_EQ(to_string(s().compare_set("k", to_bytes("v1"), to_bytes("v2"))), "v2");
  // Stale expected: unchanged, current value returned.
  EXPECT_EQ(to_string(s().compare_set("k", to_bytes("v1"), to_bytes("v3"))), "v2");
  EXPECT_EQ(to_string(s().get("k")), "v2");
  // Absent key, non-empty expected: nothing created, expected returned.
  EXPECT_EQ(to_string(s().compare_set("absent", to_bytes("x"), to_bytes("y"))), "x");
  EXPECT_FALSE(s().check({"absent"}));
}

TEST_P(StoreSemantics, CompareSetElectsExactlyOneWinner) {
  constexpr int kThreads = 8;
  std::atomic<int> winners{0};
  std::vector<std::thread> ts;
  for (int i = 0; i < kThreads; ++i) {
    ts.emplace_back([&, i] {
      auto st = env_.another();
      Bytes mine = to_bytes("rank" + std::to_string(i));
      if (st->compare_set("leader", {}, mine) == mine) winners++;
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(winners.load(), 1);
}

TEST_P(StoreSemantics, GetBlocksUntilAnotherHandleSets) {
  std::thread setter([&] {
    auto st = env_.another();
    std::this_thread::sleep_for(Millis(50));
    st->set("late", to_bytes("here"));
  });
  EXPECT_EQ(to_string(s().get("late", Millis(10000))), "here");
  setter.join();
}

TEST_P(StoreSemantics, WaitForSeveralKeys) {
  std::thread setter([&] {
    auto st = env_.another();
    st->set("x", to_bytes("1"));
    std::this_thread::sleep_for(Millis(20));
    st->add("y", 1);
    std::this_thread::sleep_for(Millis(20));
    st->compare_set("z", {}, to_bytes("1"));
  });
  s().wait({"x", "y", "z"}, Millis(10000));
  EXPECT_TRUE(s().check({"x", "y", "z"}));
  setter.join();
}

TEST_P(StoreSemantics, GetTimeoutNamesTheKey) {
  try {
    s().get("never", Millis(100));
    FAIL() << "get must time out";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kTimeout);
    EXPECT_NE(m.find("never' was never set"), std::string::npos) << m;
    EXPECT_NE(m.find("timed out after 0.1 s"), std::string::npos) << m;
  }
  // Still usable after a timeout (the TCP client cancelled its parked wait cleanly).
  s().set("after", to_bytes("ok"));
  EXPECT_EQ(to_string(s().get("after")), "ok");
}

TEST_P(StoreSemantics, WaitTimeoutListsOnlyMissingKeys) {
  s().set("present", {});
  s().set_default_timeout(Millis(150));
  try {
    s().wait({"present", "miss1", "miss2"});  // default timeout
    FAIL() << "wait must time out";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kTimeout);
    EXPECT_NE(m.find("missing keys:"), std::string::npos) << m;
    EXPECT_NE(m.find("miss1'"), std::string::npos) << m;
    EXPECT_NE(m.find("miss2'"), std::string::npos) << m;
    EXPECT_EQ(m.find("present'"), std::string::npos) << m;
    EXPECT_NE(m.find("(2 of 3)"), std::string::npos) << m;
    EXPECT_NE(m.find("0.1 s"), std::string::npos) << m;
  }
  EXPECT_EQ(s().add("still-works", 2), 2);
}

TEST_P(StoreSemantics, BarrierWithThreads) {
  constexpr int kWorld = 6;
  std::vector<std::thread> ts;
  std::atomic<int> passed{0};
  for (int i = 0; i < kWorld; ++i) {
    ts.emplace_back([&] {
      auto st = env_.another();
      barrier(*st, "init", kWorld, Millis(10000));
      passed++;
      barrier(*st, "second", kWorld, Millis(10000));
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(passed.load(), kWorld);
}

TEST_P(StoreSemantics, BarrierTimeoutSaysHowManyJoined) {
  std::vector<std::thread> ts;
  std::vector<std::string> errors(3);
  for (int i = 0; i < 3; ++i) {
    ts.emplace_back([&, i] {
      auto st = env_.another();
      try {
        barrier(*st, "short", 4, Millis(300));
      } catch (const Error& e) {
        errors[i] = e.what();
      }
    });
  }
  for (auto& t : ts) t.join();
  for (const auto& m : errors) {
    EXPECT_NE(m.find("barrier 'short'"), std::string::npos) << m;
    EXPECT_NE(m.find("3/4 workers joined after 0.3 s"), std::string::npos) << m;
  }
}

TEST_P(StoreSemantics, BarrierNameReuseIsAnError) {
  barrier(s(), "once", 1, Millis(1000));
  try {
    barrier(s(), "once", 1, Millis(1000));
    FAIL() << "reusing a barrier name must throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidUsage);
    EXPECT_NE(std::string(e.what()).find("2 workers joined a barrier for 1"), std::string::npos)
        << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(AllStores, StoreSemantics,
                         ::testing::Values("hash", "tcp", "hash_prefix", "tcp_prefix"));

TEST(PrefixStore, ScopesKeysAndComposes) {
  auto base = std::make_shared<HashStore>();
  PrefixStore gen("gen3/", base);
  PrefixStore group("group/tp0/", gen);
  group.set("addr", to_bytes("x"));
  EXPECT_TRUE(base->check({"gen3/group/tp0/addr"}));
  EXPECT_FALSE(base->check({"addr"}));
  EXPECT_EQ(to_string(gen.get("group/tp0/addr")), "x");
  EXPECT_EQ(gen.add("c", 2), 2);
  EXPECT_EQ(to_string(base->get("gen3/c")), "2");
  EXPECT_EQ(group.num_keys(), 2);  // counts the whole store, as documented
  EXPECT_TRUE(group.delete_key("addr"));
  EXPECT_FALSE(base->check({"gen3/group/tp0/addr"}));
  try {
    group.get("missing", Millis(50));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'gen3/group/tp0/missing'"), std::string::npos)
        << e.what();
  }
}

TEST(PrefixStore, OwnDefaultTimeoutIsUsed) {
  HashStore base;  // default 300 s
  PrefixStore p("p/", base);
  p.set_default_timeout(Millis(50));
  EXPECT_THROW(p.wait({"k"}), Error);  // returns in 50 ms, not 300 s
}

}  // namespace
}  // namespace ds::store
