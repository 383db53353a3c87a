// gpu_bench: tokens/s and MFU of training steps (forward + backward + fused AdamW) on ONE GPU,
// through the models' device path (ModelOptions::device = kCuda, runtime/kernels/cuda).
//
//   gpu_bench [--model NAME|all] [--batch B] [--seq T] [--steps N] [--warmup N]
//             [--math bf16|fp32] [--storage fp32|bf16] [--attention flash|exact] [--recompute]
//             [--peak-tflops P] [--device D] [--cuda-graph]
//
// Models: the named shapes of model_spec/named_shapes.h (124m, 350m, ...; a name it
// does not know lists them); `all` runs the first three. A family with rotary positions runs at --seq
// whatever its table length.
// What it measures, honestly: with --storage fp32 (the default) parameters, activations,
// gradients and optimizer state are fp32 in memory; --math bf16 (the default) runs the weight
// matmuls as bf16 tensor-core multiplies with fp32 accumulation (cuda::MatmulMath::kBf16); --math
// fp32 keeps cuBLAS's fp32 math; the rest (norms, GELU/SwiGLU, the exact attention, AdamW) runs
// in fp32 on CUDA cores. --storage bf16 is what bf16.enabled trains with on a GPU: bf16
// parameters, activations and gradients (the bf16 twins of every kernel, GEMMs over bf16 with fp32
// accumulation; --math does not apply), the attention on the tensor cores (flash_attention.cu;
// --attention exact runs the warp-per-row kernels instead), fp32 master weights, m and v.
// MFU is the trainer's (model_spec/flops.h, docs/training.md): model FLOPs per token
// 6N + 6·L·(NH·hd)·T (llm.c's count) times tokens/s, over the dense peak of the part for the math that
// ran (the same table the trainer reads: H200/H100 989.4 bf16 and 67 fp32, A100 312 / 19.5), or
// --peak-tflops. Each step's loss comes back in one copy (the trainer's training.sync_loss_once).
// --cuda-graph: the micro-batch (zero_grads, forward and backward) is captured once after the
// warm-up into a CUDA graph, on a stream of its own, and replayed each step; its token ids come
// from pinned buffers the graph's copies read at each replay, AdamW and the loss copy run after
// it, outside the graph. The ids are validated at the capture only. Not for a mixture of experts
// (the routing reads its counts on the host). Without a GPU it says so and exits 0. Not a test: it prints figures and never
// fails on them.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"
#include "core/cuda_memory_table.h"
#include "kernels/cuda_kernel_table.h"
#include "model/model.h"
#include "common/error.h"
#include "model_spec/family.h"
#include "model_spec/flops.h"
#include "model_spec/named_shapes.h"
#include "optim/adamw.h"
#include "train/throughput.h"

using namespace ds::rt;
namespace ms = ds::model_spec;

namespace {

// The CUDA module's kernels: the same copy dstrain runs (kernels/cuda_kernel_table.h).
const kern::CudaKernelTable& cu() { return kern::cuda_kernels("gpu_bench"); }

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "gpu_bench: %s: %s\n", what, cudaGetErrorString(e));
  std::exit(1);
}

struct Options {
  std::string model = "124m";
  int B = 8, T = 1024, steps = 10, warmup = 2, device = 0;
  bool recompute = false;
  bool graph = false;  // --cuda-graph
  bool bf16_math = true;
  bool bf16_storage = false;
  bool flash = true;
  double peak_tflops = 0;  // 0: the table's
};

// The named shape, at --seq for a family with rotary positions (no position table to outgrow).
ms::ModelShape shape_of(const std::string& name, int T) {
  try {
    ms::ModelShape s = ms::named_shape(name, "gpu_bench --model").shape;
    if (ms::family_of(s.family).positions == ms::PositionKind::kRope) s.seq_len = T;
    return s;
  } catch (const ds::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::exit(2);
  }
}
// What `--model all` runs: the named shapes meant for a GPU.
constexpr int kGpuShapes = 3;

std::vector<int32_t> random_ids(uint32_t seed, size_t n, int V) {
  std::vector<int32_t> v(n);
  uint32_t x = seed;
  for (auto& t : v) {
    x = x * 1664525u + 1013904223u;
    t = static_cast<int32_t>((x >> 8) % static_cast<uint32_t>(V));
  }
  return v;
}

void run(const Options& o, const std::string& name, const std::string& gpu_name) {
  const auto s = shape_of(name, o.T);
  if (o.T > s.seq_len) {
    std::fprintf(stderr, "gpu_bench: --seq %d is beyond %s's %d positions\n", o.T, name.c_str(), s.seq_len);
    std::exit(2);
  }
  const kern::ScopedCudaMatmulMath math(o.bf16_math ? cuda::MatmulMath::kBf16 : cuda::MatmulMath::kFp32);
  const kern::ScopedCudaAttentionKernel attention(o.flash ? cuda::AttentionKernel::kFlash
                                                          : cuda::AttentionKernel::kExact);
  if (o.graph && s.num_local_experts > 0) {
    std::fprintf(stderr, "gpu_bench: --cuda-graph: %s is a mixture of experts, whose routing reads its counts on "
                         "the host each micro-batch (no graph can hold that)\n", name.c_str());
    std::exit(2);
  }
  // --cuda-graph: the model runs on a stream of its own (the legacy default stream cannot be
  // captured), its token ids come from pinned buffers the graph's copies read at each replay.
  cudaStream_t stream = nullptr;
  if (o.graph) check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  Allocator alloc;
  ModelOptions mo{o.B, o.T};
  mo.recompute = o.recompute;
  mo.device = Device::kCuda;
  mo.cuda_stream = stream;
  if (o.bf16_storage) mo.dtype = mo.grad_dtype = DType::kBF16;
  auto model = make_model(s, ms::ModelPart::whole(s), mo, alloc);
  model->init_weights(1);
  auto acts = model->new_activations();
  const int64_t n = model->num_params();
  Buffer m = alloc.allocate(static_cast<size_t>(n) * 4, MemTag::kOptimizer, "adam m", Device::kCuda);
  Buffer v = alloc.allocate(static_cast<size_t>(n) * 4, MemTag::kOptimizer, "adam v", Device::kCuda);
  // bf16 storage: the fp32 master weights beside the bf16 parameters.
  Buffer master;
  auto* pbits = static_cast<uint16_t*>(model->params().data);
  if (o.bf16_storage) {
    master = alloc.allocate(static_cast<size_t>(n) * 4, MemTag::kOptimizer, "master", Device::kCuda);
    cu().convert_bf16_to_f32(master.as<float>(), pbits, n, stream);
  }
  optim::AdamWConfig cfg;
  cfg.weight_decay = 0.1;
  const size_t bt = static_cast<size_t>(o.B) * o.T;
  // The step's token ids: pinned with --cuda-graph (read by the graph's copies), else pageable.
  int32_t *tok = nullptr, *tgt = nullptr;
  std::vector<int32_t> tok_v(bt), tgt_v(bt);
  if (o.graph) {
    check(cudaMallocHost(reinterpret_cast<void**>(&tok), bt * sizeof(int32_t)), "cudaMallocHost");
    check(cudaMallocHost(reinterpret_cast<void**>(&tgt), bt * sizeof(int32_t)), "cudaMallocHost");
  } else {
    tok = tok_v.data();
    tgt = tgt_v.data();
  }
  // The micro-batch as the pieces of forward_backward, its loss kept on the device (no
  // synchronisation inside, so a stream capture can hold it).
  const auto& part = model->part();
  auto forward_backward = [&] {
    model->zero_grads();
    model->embed_forward(*acts, tok);
    model->blocks_forward(*acts, part.layer_begin, part.layer_end);
    model->head_forward_backward_deferred(*acts, tgt, 1.0f);
    model->blocks_backward(*acts, part.layer_begin, part.layer_end);
    model->embed_backward(*acts, tok);
  };
  cudaGraphExec_t graph = nullptr;
  double seconds = 0;
  float loss = 0;
  for (int step = 1; step <= o.warmup + o.steps; step++) {
    const auto t_ids = random_ids(2u * static_cast<uint32_t>(step), bt, s.vocab_size);
    const auto g_ids = random_ids(2u * static_cast<uint32_t>(step) + 1u, bt, s.vocab_size);
    std::memcpy(tok, t_ids.data(), bt * sizeof(int32_t));  // the previous step synchronised: free
    std::memcpy(tgt, g_ids.data(), bt * sizeof(int32_t));
    if (o.graph && step == o.warmup + 1) {
      // Captured once, after the warm-up made every lazy allocation (cuBLAS, scratch, slots).
      cudaGraph_t g = nullptr;
      check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
      forward_backward();
      check(cudaStreamEndCapture(stream, &g), "cudaStreamEndCapture");
      check(cudaGraphInstantiate(&graph, g, 0), "cudaGraphInstantiate");
      size_t nodes = 0;
      check(cudaGraphGetNodes(g, nullptr, &nodes), "cudaGraphGetNodes");
      check(cudaGraphDestroy(g), "cudaGraphDestroy");
      (void)model->take_losses();  // the capture counted a kept loss the replays write
      std::printf("  %s: the micro-batch captured as a CUDA graph of %zu nodes\n", name.c_str(), nodes);
    }
    const auto t0 = std::chrono::steady_clock::now();
    if (graph != nullptr) {
      check(cudaGraphLaunch(graph, stream), "cudaGraphLaunch");
    } else {
      forward_backward();
    }
    const auto st = optim::adamw_step_scalars(cfg, step, 3e-4);
    if (o.bf16_storage) {
      cu().adamw_update_bf16_grads(st, master.as<float>(), static_cast<const uint16_t*>(model->grads().data),
                                   m.as<float>(), v.as<float>(), n, true, pbits, stream);
    } else {
      cu().adamw_update(st, model->params().f32(), model->grads().f32(), m.as<float>(), v.as<float>(), n,
                        true, nullptr, stream);
    }
    // The loss: one copy back per step either way (the graph's replays write the thread's slot 0).
    if (graph != nullptr) {
      double sum = 0;
      cu().loss_slots_to_host(&sum, 1, stream);
      loss = static_cast<float>(sum / static_cast<double>(bt));
    } else {
      loss = model->take_losses().at(0);
    }
    if (cudaDeviceSynchronize() != cudaSuccess) {
      std::fprintf(stderr, "gpu_bench: CUDA error: %s\n", cudaGetErrorString(cudaGetLastError()));
      std::exit(1);
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (step > o.warmup) seconds += dt;
    std::printf("  %s step %2d  loss %.4f  %.1f ms%s\n", name.c_str(), step, loss, dt * 1e3,
                step <= o.warmup ? "  (warm-up)" : "");
  }
  if (graph != nullptr) check(cudaGraphExecDestroy(graph), "cudaGraphExecDestroy");
  if (o.graph) {
    check(cudaFreeHost(tok), "cudaFreeHost");
    check(cudaFreeHost(tgt), "cudaFreeHost");
  }
  const double tok_s = static_cast<double>(bt) * o.steps / seconds;
  const bool bf16 = o.bf16_math || o.bf16_storage;
  const double peak =
      o.peak_tflops > 0 ? o.peak_tflops
                        : train::gpu_peak_tflops(gpu_name, bf16 ? ds::layout::Precision::kBf16 : ds::layout::Precision::kFp32)
                              .value_or(0.0);
  const auto f = train::step_flops(ms::model_flops_per_token(s, o.T), static_cast<double>(bt) * o.steps, seconds,
                                   1, peak);
  const auto cache = cuda_memory().device_cache_stats(o.device);
  std::printf(
      "%s math %s (%s storage, %s attention) B=%d T=%d%s%s: %.1f ms/step, %.0f tokens/s, %.1f TFLOP/s, "
      "MFU %.2f%% of %.1f TFLOP/s %s; params %.1fM; allocator peak %.2f GiB, device cache reserved %.2f GiB\n",
      name.c_str(), bf16 ? "bf16" : "fp32", o.bf16_storage ? "bf16" : "fp32",
      o.bf16_storage && o.flash ? "flash" : "exact", o.B, o.T, o.recompute ? " recompute" : "",
      o.graph ? " cuda-graph" : "",
      seconds / o.steps * 1e3, tok_s, f.tflops, f.mfu * 100, peak, bf16 ? "bf16" : "fp32",
      static_cast<double>(n) / 1e6, static_cast<double>(alloc.peak_total()) / (1 << 30),
      static_cast<double>(cache.peak_reserved_bytes) / (1 << 30));
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "gpu_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--model") o.model = next();
    else if (a == "--batch") o.B = std::atoi(next());
    else if (a == "--seq") o.T = std::atoi(next());
    else if (a == "--steps") o.steps = std::atoi(next());
    else if (a == "--warmup") o.warmup = std::atoi(next());
    else if (a == "--device") o.device = std::atoi(next());
    else if (a == "--recompute") o.recompute = true;
    else if (a == "--cuda-graph") o.graph = true;
    else if (a == "--math") {
      const std::string m = next();
      if (m != "bf16" && m != "fp32") {
        std::fprintf(stderr, "gpu_bench: --math must be bf16 or fp32, got '%s'\n", m.c_str());
        return 2;
      }
      o.bf16_math = m == "bf16";
    } else if (a == "--storage") {
      const std::string m = next();
      if (m != "bf16" && m != "fp32") {
        std::fprintf(stderr, "gpu_bench: --storage must be fp32 or bf16, got '%s'\n", m.c_str());
        return 2;
      }
      o.bf16_storage = m == "bf16";
    }
    else if (a == "--attention") {
      const std::string m = next();
      if (m != "flash" && m != "exact") {
        std::fprintf(stderr, "gpu_bench: --attention must be flash or exact, got '%s'\n", m.c_str());
        return 2;
      }
      o.flash = m == "flash";
    }
    else if (a == "--peak-tflops") o.peak_tflops = std::atof(next());
    else {
      std::fprintf(stderr, "gpu_bench: unknown option %s (see the header of bench/gpu_bench.cpp)\n",
                   a.c_str());
      return 2;
    }
  }
  if (o.B < 1 || o.T < 1 || o.steps < 1 || o.warmup < 0) {
    std::fprintf(stderr, "gpu_bench: need --batch >= 1, --seq >= 1, --steps >= 1\n");
    return 2;
  }
  const auto acc = query_accelerators();
  if (acc.gpus.empty()) {
    std::printf("gpu_bench: no CUDA device visible (%s); nothing to measure\n", acc.status.c_str());
    return 0;
  }
  if (cudaSetDevice(o.device) != cudaSuccess) {
    std::fprintf(stderr, "gpu_bench: cannot use device %d\n", o.device);
    return 2;
  }
  const auto& g = acc.gpus[static_cast<size_t>(o.device)];
  std::printf("gpu_bench on [%d] %s, %.0f GiB, sm_%d%d, CUDA runtime %s, driver %s; %s\n", o.device,
              g.name.c_str(), static_cast<double>(g.total_bytes) / (1 << 30), g.sm_major, g.sm_minor,
              acc.cuda_runtime.c_str(), acc.cuda_driver.c_str(),
              o.bf16_storage ? "bf16 storage (bf16 GEMMs, CUBLAS_COMPUTE_32F)"
                             : o.bf16_math ? "fp32 storage, matmul math bf16 (CUBLAS_COMPUTE_32F_FAST_16BF)"
                                           : "fp32 storage, matmul math fp32");
  try {
    if (o.model == "all") {
      for (int i = 0; i < kGpuShapes; i++) run(o, ms::named_shapes()[i].name, g.name);
    } else {
      run(o, o.model, g.name);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
