// One rank of `dstrain plan --calibrate` (calibration_rank.h): the measuring, with the runtime's
// own model (any family), kernels and backends.
#include "train/calibration_rank.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "comm/comm.h"
#include "common/error.h"
#include "config/job_config.h"
#include "core/allocator.h"
#include "kernels/cpu/kernels.h"
#include "kernels/dispatch.h"
#include "model/decoder.h"
#include "model_spec/named_shapes.h"
#include "plan/calibration.h"
#include "plan/plan_inputs.h"
#include "store/tcp_store_client.h"

namespace ds::rt::train {

namespace {

using Clock = std::chrono::steady_clock;

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

// The least disturbed of a few repetitions: on a shared machine the minimum is the figure
// other load inflates least, for the calibration and the measured steps alike.
double fastest(const std::vector<double>& v) { return v.empty() ? 0 : *std::min_element(v.begin(), v.end()); }
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Worker {
  int rank = 0, world = 1, local_rank = 0, local_world = 1, nodes = 1;
  comm::CommPtr comm;
  model_spec::ModelShape shape;
  layout::Precision precision = layout::Precision::kFp32;
  int max_micro_batch = 16;
  int cores = 1;
  int threads = 1;
  Device device = Device::kCpu;  // kCuda: this rank's GPU (training.device cuda)

  // The slowest rank's value of x (ranks that did not measure pass 0).
  double slowest(double x) {
    int64_t ns = static_cast<int64_t>(x * 1e9);
    comm->all_reduce(&ns, 1, comm::DataType::kInt64, comm::ReduceOp::kMax);
    return static_cast<double>(ns) / 1e9;
  }
};

DType dtype_of(layout::Precision p) {
  return p == layout::Precision::kBf16 ? DType::kBF16 : p == layout::Precision::kFp16 ? DType::kF16 : DType::kF32;
}

// On a GPU: waits until the work queued on the default stream is done (a 4-byte copy back is
// stream-ordered and blocking); on the CPU: nothing.
class GpuWait {
 public:
  GpuWait(Allocator& alloc, Device device) {
    if (device == Device::kCuda) flag_ = alloc.allocate(64, MemTag::kWorkspace, "calibration: wait", Device::kCuda);
  }
  void operator()() const {
    if (flag_.data() == nullptr) return;
    const kern::DeviceScope scope(Device::kCuda);
    float x = 0;
    kern::copy_to_host(&x, flag_.data(), sizeof x);
  }

 private:
  Buffer flag_;
};

// Seconds of each piece over a few repetitions of one micro-batch of b sequences: the fastest
// repetition (what other load inflates least), or with `typical` the median: when more of the
// node's ranks compute at once than it has cores for, each rank's fastest repetition is one in
// which it happened to have a core to itself (4 ranks on 2 cores: the fastest was ~1x a rank
// alone, the median ~2x), and the point of those samples is how much the ranks slow each other.
// While every rank has its cores the fastest stays right: the median there only adds the noise
// the alone samples leave out (2 ranks on 2 cores: median 1.10x alone, fastest 1.0x, and the
// measured steps ran at the alone speed).
plan::ComputeSample time_pieces(const Worker& w, int tp, int b, bool typical) {
  Allocator alloc;
  ModelOptions opt;
  opt.B = b;
  opt.T = w.shape.seq_len;
  opt.dtype = opt.grad_dtype = dtype_of(w.precision);
  opt.device = w.device;
  model_spec::ModelPart part{0, 1, true, true, tp, 0};
  Decoder model(w.shape, part, opt, alloc);
  const GpuWait wait(alloc, w.device);
  model.init_weights(1);
  DecoderActivations acts = model.make_activations();
  std::vector<int32_t> tokens(static_cast<size_t>(b) * w.shape.seq_len);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7919) % w.shape.vocab_size);
  std::vector<double> t[5];
  const auto start = Clock::now();
  for (int rep = 0; rep < 8; ++rep) {
    double s[6];
    auto tick = [&](int k) {
      wait();  // on a GPU a piece ends when its kernels do
      s[k] = std::chrono::duration<double>(Clock::now() - start).count();
    };
    tick(0);
    model.embed_forward(acts, tokens.data());
    tick(1);
    model.blocks_forward(acts, 0, 1);
    tick(2);
    model.head_forward_backward(acts, tokens.data(), 1.0f);
    tick(3);
    model.blocks_backward(acts, 0, 1);
    tick(4);
    model.embed_backward(acts, tokens.data());
    tick(5);
    if (rep == 0) continue;  // warm-up
    for (int k = 0; k < 5; ++k) t[k].push_back(s[k + 1] - s[k]);
    if (rep >= 3 && s[5] > 1.5) break;
  }
  plan::ComputeSample c;
  c.tp = tp;
  c.micro_batch = b;
  c.precision = w.precision;
  const auto pick = [typical](std::vector<double>& v) { return typical ? median(v) : fastest(v); };
  c.embed_fwd = pick(t[0]);
  c.layer_fwd = pick(t[1]);
  c.head = pick(t[2]);
  c.layer_bwd = pick(t[3]);
  c.embed_bwd = pick(t[4]);
  return c;
}

std::vector<int> doubling(int upto) {
  std::vector<int> v;
  for (int k = 1; k < upto; k *= 2) v.push_back(k);
  v.push_back(upto);
  return v;
}

// Whether tensor parallelism of size tp can split the model (the family's rules, shape.h).
bool splits_by(const model_spec::ModelShape& s, int tp) {
  try {
    s.validate_tp(tp);
    return true;
  } catch (const Error&) {
    return false;
  }
}

void measure_compute(Worker& w, plan::Calibration& cal) {
  std::vector<int> tps;
  for (int tp = 1; tp <= w.local_world; ++tp) {
    if (splits_by(w.shape, tp)) tps.push_back(tp);
  }
  // GPUs: each rank has its own, so ranks do not slow each other's compute (concurrency 1).
  const std::vector<int> concurrency = w.device == Device::kCuda ? std::vector<int>{1} : doubling(w.local_world);
  for (int conc : concurrency) {
    for (int tp : tps) {
      for (int b : doubling(w.max_micro_batch)) {
        w.comm->barrier();
        plan::ComputeSample c;
        if (w.local_rank < conc) c = time_pieces(w, tp, b, /*typical=*/conc * w.threads > w.cores);
        c.tp = tp, c.micro_batch = b, c.precision = w.precision, c.concurrency = conc;
        c.layer_fwd = w.slowest(c.layer_fwd);
        c.layer_bwd = w.slowest(c.layer_bwd);
        c.embed_fwd = w.slowest(c.embed_fwd);
        c.embed_bwd = w.slowest(c.embed_bwd);
        c.head = w.slowest(c.head);
        cal.compute.push_back(c);
      }
    }
  }
}

// Fastest seconds of one call of `op` on `bytes` over `g`, the slowest rank's.
double time_collective(Worker& w, comm::Comm& g, plan::CollectiveOp op, size_t bytes) {
  const size_t n = bytes / 4;
  std::vector<float> in(n, 1.0f), out(n, 0.0f);
  const size_t part = n / static_cast<size_t>(g.size());
  std::vector<double> t;
  for (int rep = 0; rep < 8; ++rep) {
    w.comm->barrier();
    const auto t0 = Clock::now();
    switch (op) {
      case plan::CollectiveOp::kAllReduce: g.all_reduce(in.data(), n, comm::DataType::kFloat32, comm::ReduceOp::kSum); break;
      case plan::CollectiveOp::kReduceScatter:
        g.reduce_scatter(in.data(), out.data(), part, comm::DataType::kFloat32, comm::ReduceOp::kSum);
        break;
      case plan::CollectiveOp::kAllGather: g.all_gather(in.data(), out.data(), part, comm::DataType::kFloat32); break;
      case plan::CollectiveOp::kSendRecv:
        if (g.rank() == 0) g.send(in.data(), n, comm::DataType::kFloat32, 1, 7);
        else g.recv(out.data(), n, comm::DataType::kFloat32, 0, 7);
        break;
      case plan::CollectiveOp::kAllToAll: {  // `bytes` is the whole send buffer, a part per rank
        const std::vector<size_t> counts(static_cast<size_t>(g.size()), part);
        g.all_to_all_v(in.data(), counts, out.data(), counts, comm::DataType::kFloat32);
        break;
      }
      case plan::CollectiveOp::kRingExchange:  // as the context-parallel ring runs its step
        g.ring_exchange_async(in.data(), out.data(), n, comm::DataType::kFloat32)->wait();
        break;
    }
    if (rep > 0) t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return w.slowest(fastest(t));
}

void measure_group_shape(Worker& w, plan::Calibration& cal, int g, bool strided) {
  const int groups = w.world / g;
  std::vector<int> members;
  for (int i = 0; i < g; ++i) {
    members.push_back(strided ? w.rank % groups + i * groups : (w.rank / g) * g + i);
  }
  bool across = false;
  for (int r : members) across = across || r / w.local_world != members[0] / w.local_world;
  auto grp = w.comm->new_group(members, fmt::format("calib-{}{}-{}", strided ? "s" : "c", g,
                                                    strided ? w.rank % groups : w.rank / g));
  const size_t sizes[] = {size_t{64} << 10, size_t{256} << 10, size_t{1} << 20, size_t{4} << 20, size_t{8} << 20};
  const plan::CollectiveOp ops[] = {plan::CollectiveOp::kAllReduce, plan::CollectiveOp::kReduceScatter,
                                    plan::CollectiveOp::kAllGather, plan::CollectiveOp::kAllToAll,
                                    plan::CollectiveOp::kRingExchange};
  for (auto op : ops) {
    std::vector<std::pair<double, double>> pts;
    for (size_t b : sizes) pts.emplace_back(static_cast<double>(b), time_collective(w, *grp, op, b));
    cal.collectives.push_back(plan::fit_collective(op, g, groups, across, pts));
  }
  if (g != 2) return;
  std::vector<std::pair<double, double>> pts;
  for (size_t b : sizes) pts.emplace_back(static_cast<double>(b), time_collective(w, *grp, plan::CollectiveOp::kSendRecv, b));
  cal.collectives.push_back(plan::fit_collective(plan::CollectiveOp::kSendRecv, 2, groups, across, pts));
}

void measure_collectives(Worker& w, plan::Calibration& cal) {
  for (int g = 2; g <= w.world; ++g) {
    if (w.world % g != 0) continue;
    measure_group_shape(w, cal, g, false);
    if (w.nodes > 1 && g < w.world) measure_group_shape(w, cal, g, true);
  }
}

// Fastest seconds of `run` over a few repetitions after one warm-up.
template <typename Run>
double fastest_of(Run run, int reps = 4) {
  std::vector<double> ts;
  for (int rep = 0; rep < reps; ++rep) {
    const auto t0 = Clock::now();
    run();
    if (rep > 0) ts.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return fastest(ts);
}

kern::AdamWStep calibration_adamw_step() {
  kern::AdamWStep s;
  s.lr = 1e-4f, s.beta1 = 0.9f, s.beta2 = 0.95f, s.eps = 1e-8f, s.one_minus_beta1 = 0.1f;
  s.one_minus_beta2 = 0.05f, s.step_size = 1e-4f, s.decay_factor = 1.0f;
  return s;
}

// The CPU AdamW kernel's parameters/s with as many ranks at once as share the cores; on GPUs
// also the GPU's AdamW (the optimizer's rate there) and the pinned host -> GPU copy rate (what
// ZeRO-Offload moves).
void measure_optimizer(Worker& w, plan::Calibration& cal) {
  const int conc = w.device == Device::kCuda ? 1 : std::min(w.local_world, std::max(1, w.cores / w.threads));
  const int64_t n = int64_t{4} << 20;
  const kern::AdamWStep s = calibration_adamw_step();
  double t = 0;
  w.comm->barrier();
  if (w.local_rank < conc) {
    std::vector<float> p(n, 0.1f), g(n, 0.01f), m(n, 0.0f), v(n, 0.0f);
    t = fastest_of([&] { cpu::adamw_update(s, p.data(), g.data(), m.data(), v.data(), n, true); });
  }
  cal.cpu_adam_rate = static_cast<double>(n) / w.slowest(t);
  cal.optimizer_rate = cal.cpu_adam_rate;
  if (w.device != Device::kCuda) return;
  Allocator alloc;
  const GpuWait wait(alloc, Device::kCuda);
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  Buffer p = alloc.allocate(bytes, MemTag::kParams, "calibration: params", Device::kCuda);
  Buffer g = alloc.allocate(bytes, MemTag::kGrads, "calibration: grads", Device::kCuda);
  Buffer m = alloc.allocate(bytes, MemTag::kOptimizer, "calibration: m", Device::kCuda);
  Buffer v = alloc.allocate(bytes, MemTag::kOptimizer, "calibration: v", Device::kCuda);
  Buffer host = alloc.allocate(bytes, MemTag::kWorkspace, "calibration: pinned", Device::kCudaHost);
  const kern::DeviceScope scope(Device::kCuda);
  const double adam = fastest_of([&] {
    kern::adamw_update_partition(s, p.as<float>(), g.as<float>(), m.as<float>(), v.as<float>(), 0, n, {});
    wait();
  });
  const double link = fastest_of([&] {
    kern::copy(p.data(), host.data(), bytes);
    wait();
  });
  cal.optimizer_rate = static_cast<double>(n) / w.slowest(adam);
  cal.host_link_bw = static_cast<double>(bytes) / w.slowest(link);
}

Worker make_worker(const std::string& config, const config::ParseOptions& parse) {
  Worker w;
  w.rank = env_int("RANK", 0);
  w.world = env_int("WORLD_SIZE", 1);
  w.local_rank = env_int("LOCAL_RANK", 0);
  w.local_world = env_int("LOCAL_WORLD_SIZE", 1);
  w.nodes = std::max(1, w.world / std::max(1, w.local_world));
  w.cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  w.threads = plan::resolve_threads_per_rank(0);
  w.shape = model_spec::named_shape(model_spec::kDefaultCalibrationShape, "dstrain plan --calibrate").shape;
  if (!config.empty()) {
    const config::JobConfig cfg = config::load_job_config(config, w.world, parse);
    plan::PlanInput in = plan::plan_input_from_config(cfg);
    in.layout.num_threads = w.threads;
    if (in.layout.device == plan::DeviceKind::kCuda) {
      if (w.world > 1) {
        throw Error(ErrorKind::kInvalidArgument,
                    fmt::format("{}: training.device cuda: --calibrate measures one GPU (its compute, its AdamW and "
                                "its host link); {} ranks were started, and collectives over NCCL are not "
                                "calibrated yet",
                                config, w.world),
                    "run it with --nproc-per-node 1");
      }
      w.device = Device::kCuda;
    }
    w.shape = in.shape;
    w.precision = in.layout.precision;
    const int64_t batch = static_cast<int64_t>(in.layout.micro_batch) * in.layout.grad_accum * in.layout.dp;
    // A micro-batch "auto" is the plan's to pick later: measure every size up to the cap.
    w.max_micro_batch = cfg.auto_micro_batch.pending ? 16 : static_cast<int>(std::clamp<int64_t>(batch, 1, 16));
  }
  w.comm = comm::make_world_comm(store::connect_from_env(), w.rank, w.world);
  return w;
}

std::string hostname() {
  char h[256] = {0};
  gethostname(h, sizeof h - 1);
  return h;
}

}  // namespace

void run_calibration_rank(const std::string& config, const std::string& out_path,
                          const config::ParseOptions& parse) {
  Worker w = make_worker(config, parse);
  plan::Calibration cal;
  cal.measured = true;
  const bool gpu = w.device == Device::kCuda;
  cal.cpu = !gpu;
  cal.cores = gpu ? 0 : w.cores;
  cal.threads_per_rank = w.threads;
  cal.ranks_per_node = w.local_world;
  cal.shape = w.shape;
  measure_compute(w, cal);
  measure_collectives(w, cal);
  measure_optimizer(w, cal);
  if (w.rank == 0) {
    plan::CalibrationMeta meta;
    meta.host = hostname();
    meta.device = gpu ? "cuda" : "cpu";
    meta.backend = gpu ? "nccl" : comm::backend_name(w.comm->backend());
    meta.nodes = w.nodes;
    std::ofstream(out_path) << plan::calibration_json(cal, meta).dump(2) << "\n";
  }
  w.comm->barrier();
}

}  // namespace ds::rt::train
