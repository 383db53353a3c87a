// The host world's bookkeeping collectives (host_world.h). The sums gather every rank's values
// and add them in rank order rather than all-reducing, so the result does not depend on the
// backend's reduction order: every rank sees the same bits, and so agrees on an overflow.
#include "parallel/host_world.h"

namespace ds::rt::parallel {

namespace {
constexpr int kGatherTag = 21;
}  // namespace

HostWorld::HostWorld(comm::CommPtr world) : world_(std::move(world)) {}

std::vector<double> HostWorld::sum_in_rank_order(const std::vector<double>& mine) {
  return comm::sum_in_rank_order(world_.get(), mine);
}

std::vector<int64_t> HostWorld::gather_int64(const std::vector<int64_t>& mine) {
  return comm::gather_int64(world_.get(), mine);
}

void HostWorld::barrier() {
  if (world_) world_->barrier();
}

void HostWorld::gather_to_root(std::span<const float> mine, const std::function<bool(int)>& contributes,
                               const std::function<void(int, std::span<const float>)>& consume,
                               const std::function<void()>& finish) {
  const auto sizes = gather_int64({static_cast<int64_t>(mine.size())});
  if (rank() != 0) {
    if (contributes(rank())) world_->send(mine.data(), mine.size(), comm::DataType::kFloat32, 0, kGatherTag);
    barrier();
    return;
  }
  std::vector<float> buf;
  for (int q = 0; q < size(); ++q) {
    if (!contributes(q)) continue;
    if (q == 0) {
      consume(0, mine);
      continue;
    }
    buf.resize(static_cast<size_t>(sizes[static_cast<size_t>(q)]));
    world_->recv(buf.data(), buf.size(), comm::DataType::kFloat32, q, kGatherTag);
    consume(q, buf);
  }
  finish();
  barrier();
}

HostWorld HostWorld::twin(const std::string& name) {
  if (!world_) return HostWorld();
  std::vector<int> all(static_cast<size_t>(size()));
  for (int q = 0; q < size(); ++q) all[static_cast<size_t>(q)] = q;
  return HostWorld(world_->new_group(all, name));
}

void HostWorld::in_phases(const std::function<void()>& prepare, const std::function<void()>& write,
                          const std::function<void()>& commit) {
  if (rank() == 0) prepare();
  barrier();
  write();
  barrier();
  if (rank() == 0) commit();
  barrier();
}

}  // namespace ds::rt::parallel
