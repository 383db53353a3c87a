// Gloo rendezvous through our store: 4 ranks as threads, each with its own TCP store client,
// connect a full mesh through GlooStoreAdapter and run a real Gloo allreduce.
#include <gtest/gtest.h>

#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include <thread>

#include "store/gloo_store_adapter.h"
#include "store/hash_store.h"
#include "store/prefix_store.h"
#include "store_test_util.h"

namespace ds::store {
namespace {

// Runs one rank: rendezvous through `store`, allreduce (sum) of rank-dependent floats.
std::vector<float> allreduce_rank(Store& store, int rank, int world, size_t n) {
  GlooStoreAdapter adapter(store);
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, world);
  ctx->setTimeout(std::chrono::seconds(20));
  ctx->connectFullMesh(adapter, dev);
  std::vector<float> data(n);
  for (size_t i = 0; i < n; ++i) data[i] = static_cast<float>(rank + 1) * static_cast<float>(i);
  gloo::AllreduceOptions opts(ctx);
  opts.setOutput(data.data(), data.size());
  opts.setReduceFunction(
      static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
  opts.setTimeout(std::chrono::seconds(20));
  gloo::allreduce(opts);
  return data;
}

void run_world(const std::function<std::shared_ptr<Store>(int)>& store_for, int world) {
  constexpr size_t kN = 4096;
  std::vector<std::vector<float>> out(world);
  std::vector<std::string> errors(world);
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r) {
    ts.emplace_back([&, r] {
      try {
        auto st = store_for(r);
        out[r] = allreduce_rank(*st, r, world, kN);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : ts) t.join();
  const float factor = static_cast<float>(world * (world + 1) / 2);
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    ASSERT_EQ(out[r].size(), kN);
    for (size_t i = 0; i < kN; i += 97) {
      EXPECT_FLOAT_EQ(out[r][i], factor * static_cast<float>(i)) << "rank " << r << " i " << i;
    }
  }
}

TEST(GlooStoreAdapter, AllreduceOverTcpStore) {
  auto server = test::start_server();
  run_world(
      [&](int r) {
        std::shared_ptr<Store> c(test::connect(*server, r, 4));
        return std::make_shared<PrefixStore>("gloo/world/", c);
      },
      4);
  // Gloo's address keys went through the prefix.
  auto c = test::connect(*server);
  EXPECT_TRUE(c->check({"gloo/world/0", "gloo/world/3"}));
}

TEST(GlooStoreAdapter, AllreduceOverHashStore) {
  auto h = std::make_shared<HashStore>();
  run_world([&](int) { return h; }, 3);
}

TEST(GlooStoreAdapter, WaitTimeoutPropagates) {
  HashStore h;
  GlooStoreAdapter a(h);
  try {
    a.wait({"never"}, std::chrono::milliseconds(50));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kTimeout);
  }
  a.set("k", {'a', 'b'});
  EXPECT_EQ(a.get("k"), (std::vector<char>{'a', 'b'}));
}

}  // namespace
}  // namespace ds::store
