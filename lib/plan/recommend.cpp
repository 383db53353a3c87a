// Layout search and the step-time model; formulas in recommend.h.
#include "plan/recommend.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "common/error.h"
#include "common/strings.h"

namespace ds::plan {

namespace {

std::vector<int> divisors(int64_t n) {
  std::vector<int> d;
  for (int64_t i = 1; i <= n; ++i) {
    if (n % i == 0) d.push_back(static_cast<int>(i));
  }
  return d;
}

}  // namespace

std::string describe_layout(const Layout& l) {
  std::string s = fmt::format("tp {} x pp {} x dp {}, ZeRO-{}, micro-batch {} x {} step{}", l.tp,
                              l.pp, l.dp, l.zero_stage, l.micro_batch, l.grad_accum,
                              l.grad_accum == 1 ? "" : "s");
  if (l.checkpointing) s += ", checkpointing";
  if (l.offload_param) {
    s += ", offload params+optimizer";
  } else if (l.offload_optimizer) {
    s += ", offload optimizer";
  }
  return s;
}

StepTime estimate_step_time(const model_spec::Gpt2Shape& s, const Layout& l, const Hardware& hw) {
  StepTime t;
  const double T = s.seq_len, C = s.n_embd, L = s.n_layer, Vp = s.padded_vocab_size;
  const double r = l.checkpointing ? 1 : 0;
  const double m = l.grad_accum, b = l.micro_batch;
  const double world = l.world_size();
  const double pb = param_bytes(l.precision);
  const double global_batch = b * m * l.dp;
  const double flops_per_token = (3 + r) * L * (24 * C * C + 4 * T * C) + 3 * 2 * C * Vp;
  t.compute = global_batch * T * flops_per_token / (world * hw.gpu_flops);
  t.bubble = t.compute * (l.pp - 1) / m;

  const double act_msg = b * T * C * pb;
  const double layers_per_stage = std::ceil(L / l.pp);
  t.overhead = m * layers_per_stage * hw.layer_overhead;
  if (l.tp > 1) {
    const double ring = 2.0 * (l.tp - 1) / l.tp;
    t.tp_comm = m * layers_per_stage * (4 + 2 * r) * act_msg * ring / hw.intra_node_bw;
  }
  const bool stages_span_nodes = l.tp * l.dp >= hw.gpus_per_node;
  if (l.pp > 1) {
    t.pp_comm = m * 2 * act_msg / (stages_span_nodes ? hw.inter_node_bw : hw.intra_node_bw);
  }
  // Parameters of the largest part (the first stage's tp shard).
  const std::vector<int> bounds = stage_bounds(s, l.pp, l.partition, l.tp);
  double n = 0;
  for (int st = 0; st < l.pp; ++st) {
    model_spec::ModelPart part{bounds[static_cast<size_t>(st)], bounds[static_cast<size_t>(st) + 1],
                               st == 0, st == l.pp - 1, l.tp, 0};
    n = std::max(n, static_cast<double>(model_spec::part_param_count(s, part)));
  }
  if (l.dp > 1) {
    const double bw = l.tp * l.dp > hw.gpus_per_node ? hw.inter_node_bw : hw.intra_node_bw;
    const double frac = (l.dp - 1.0) / l.dp;
    double volume = 0;
    switch (l.zero_stage) {
      case 0:
      case 1: volume = 2 * frac; break;
      case 2: volume = m * frac + frac; break;
      default: volume = m * (3 + r) * frac; break;
    }
    t.dp_comm = volume * n * pb / bw;
  }
  if (l.offload_optimizer) {
    const double shard = n / l.dp;
    t.offload = 2 * shard * pb / hw.pcie_bw + shard / hw.cpu_adam_rate;
  }
  return t;
}

namespace {

std::string reason_for(const Candidate& c, int64_t device_bytes) {
  const StepTime& t = c.time;
  std::vector<std::pair<double, std::string>> parts = {
      {t.compute, "compute"},  {t.bubble, "pipeline bubble"}, {t.tp_comm, "tensor-parallel all-reduce"},
      {t.pp_comm, "pipeline send/recv"}, {t.dp_comm, "data-parallel gradient/parameter traffic"},
      {t.offload, "CPU optimizer and PCIe"}, {t.overhead, "per-micro-batch kernel overhead"}};
  std::sort(parts.begin(), parts.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string overhead;
  if (parts[0].second == "compute") {
    overhead = parts[1].first > 0 ? fmt::format("; next: {} {:.0f}%", parts[1].second,
                                                100 * parts[1].first / t.total())
                                  : "; no communication";
  } else {
    overhead = fmt::format("; {} dominates ({:.0f}%)", parts[0].second, 100 * parts[0].first / t.total());
  }
  return fmt::format("peak {} leaves {} free; compute {:.0f}% of the step{}",
                     format_bytes(static_cast<double>(c.peak_bytes)),
                     format_bytes(static_cast<double>(device_bytes - c.peak_bytes)),
                     100 * t.compute / t.total(), overhead);
}

}  // namespace

SearchResult recommend(const model_spec::Gpt2Shape& s, const Layout& base, int world_size,
                       int64_t device_bytes, const Hardware& hw) {
  if (world_size < 1) throw invalid_argument("--world-size must be at least 1, got {}", world_size);
  if (device_bytes <= 0) throw invalid_argument("--recommend needs the device memory (--gpu-mem), got {}", device_bytes);
  s.validate();
  const int64_t global_batch = static_cast<int64_t>(base.micro_batch) * base.grad_accum * base.dp;
  SearchResult res;
  for (int tp : divisors(world_size)) {
    for (int pp : divisors(world_size / tp)) {
      const int dp = world_size / (tp * pp);
      for (int zero = 0; zero <= 3; ++zero) {
        for (int offload = 0; offload <= 2; ++offload) {  // none, optimizer, params + optimizer
          if ((offload == 1 && zero == 0) || (offload == 2 && zero != 3)) continue;
          if (offload > 0 && base.device == DeviceKind::kCpu) continue;  // nothing to offload to
          if (offload == 2) continue;  // the runtime offloads the optimizer, not ZeRO-3 params
          for (int ckpt = 0; ckpt <= 1; ++ckpt) {
            Layout l = base;
            l.tp = tp;
            l.pp = pp;
            l.dp = dp;
            l.zero_stage = zero;
            l.offload_optimizer = offload >= 1;
            l.offload_param = offload == 2;
            l.checkpointing = ckpt == 1;
            if (global_batch % dp != 0) {
              ++res.considered;
              ++res.rejected_rule;  // train_batch_size must divide by dp
              continue;
            }
            for (int mb : divisors(global_batch / dp)) {
              ++res.considered;
              l.micro_batch = mb;
              l.grad_accum = static_cast<int>(global_batch / dp / mb);
              if (tp > hw.gpus_per_node) {  // tensor parallelism stays inside a node
                ++res.rejected_rule;
                continue;
              }
              try {
                MemoryPlan p = plan_memory(s, l);
                const int64_t peak = p.peak_total();
                if (peak > device_bytes) {
                  ++res.rejected_memory;
                  continue;
                }
                Candidate c;
                c.layout = l;
                c.peak_bytes = peak;
                c.time = estimate_step_time(s, l, hw);
                res.fits.push_back(std::move(c));
              } catch (const Error&) {
                ++res.rejected_rule;
              }
            }
          }
        }
      }
    }
  }
  // Fastest first; ties: less memory, then the simpler layout (no offload, no checkpointing).
  std::stable_sort(res.fits.begin(), res.fits.end(), [](const Candidate& a, const Candidate& b) {
    const double ta = a.time.total(), tb = b.time.total();
    if (std::fabs(ta - tb) > 1e-9 * std::max(ta, tb)) return ta < tb;
    return a.peak_bytes < b.peak_bytes;
  });
  for (auto& c : res.fits) c.reason = reason_for(c, device_bytes);
  return res;
}

}  // namespace ds::plan
