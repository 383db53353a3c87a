// Layout search; the step-time model is step_time.h.
#include "plan/recommend.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "common/error.h"
#include "common/strings.h"
#include "layout/context_parallel.h"

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
  std::string s = fmt::format("tp {} x pp {} x dp {}{}, ZeRO-{}, micro-batch {} x {} step{}", l.tp, l.pp, l.dp,
                              (l.cp > 1 ? fmt::format(" x cp {} ({})", l.cp, layout::cp_method_name(l.cp_method)) : "") +
                                  (l.ep > 1 ? fmt::format(" x ep {}", l.ep) : ""),
                              l.zero_stage, l.micro_batch, l.grad_accum, l.grad_accum == 1 ? "" : "s");
  if (l.sequence_parallel) s += ", sequence-parallel";
  if (l.checkpointing) s += ", checkpointing";
  if (l.offload_param) {
    s += ", offload params+optimizer";
  } else if (l.offload_optimizer) {
    s += ", offload optimizer";
  }
  return s;
}

Calibration builtin_calibration(const Hardware& hw) {
  Calibration c;
  c.flops = hw.gpu_flops;
  c.layer_overhead = hw.layer_overhead;
  c.intra_node_bw = hw.intra_node_bw;
  c.inter_node_bw = hw.inter_node_bw;
  c.host_link_bw = hw.pcie_bw;
  c.cpu_adam_rate = hw.cpu_adam_rate;
  c.optimizer_rate = 50e9;  // a GPU's fused AdamW: ~28 bytes per parameter at ~1.5 TB/s
  c.ranks_per_node = hw.gpus_per_node;
  return c;
}

StepTime estimate_step_time(const model_spec::ModelShape& s, const Layout& l, const Hardware& hw) {
  return step_time(s, l, builtin_calibration(hw), comm_types(l.precision, l.precision, l.device == DeviceKind::kCuda));
}

namespace {

std::vector<std::pair<double, std::string>> terms(const StepTime& t) {
  return {{t.compute - t.recompute, "compute"},
          {t.recompute, "recomputation"},
          {t.bubble, "pipeline bubble"},
          {t.tp_comm, "tensor-parallel all-reduces"},
          {t.pp_comm, "pipeline send/recv"},
          {t.cp_comm, "context-parallel transfers"},
          {t.ep_comm, "expert all-to-alls"},
          {t.dp_comm, "exposed data-parallel traffic"},
          {t.optimizer, "optimizer"},
          {t.offload, "offload (host link, CPU Adam)"},
          {t.overhead, "fixed per-step overhead"},
          {t.shared_cores, "ranks sharing cores"}};
}

std::string reason_for(const Candidate& c, int64_t device_bytes) {
  auto parts = terms(c.time);
  std::sort(parts.begin(), parts.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  const double total = c.time.total();
  std::string bound = fmt::format("bound by {} {:.0f}%", parts[0].second, 100 * parts[0].first / total);
  if (parts[1].first > 0) bound += fmt::format(", then {} {:.0f}%", parts[1].second, 100 * parts[1].first / total);
  return fmt::format("{}; peak {} leaves {} free", bound, format_bytes(static_cast<double>(c.peak_bytes)),
                     format_bytes(static_cast<double>(device_bytes - c.peak_bytes)));
}

}  // namespace

std::string compare_steps(const Candidate& a, const Candidate& b) {
  const auto ta = terms(a.time), tb = terms(b.time);
  std::vector<std::pair<double, std::string>> d;
  for (size_t i = 0; i < ta.size(); ++i) d.push_back({tb[i].first - ta[i].first, ta[i].second});
  std::sort(d.begin(), d.end(),
            [](const auto& x, const auto& y) { return std::fabs(x.first) > std::fabs(y.first); });
  const double diff = b.time.total() - a.time.total();
  std::string out = fmt::format("{:+.1f}% ({:+.1f} ms):", 100 * diff / a.time.total(), 1e3 * diff);
  int shown = 0;
  for (const auto& [v, name] : d) {
    if (shown == 3 || std::fabs(v) < 1e-3 * a.time.total()) break;
    out += fmt::format("{} {} {:+.1f} ms", shown++ ? "," : "", name, 1e3 * v);
  }
  if (shown == 0) out += " the same terms";
  return out;
}

SearchResult recommend(const model_spec::ModelShape& s, const Layout& base, int world_size,
                       int64_t device_bytes, const Calibration& cal, const CommTypes& types) {
  if (world_size < 1) throw invalid_argument("--world-size must be at least 1, got {}", world_size);
  if (device_bytes <= 0)
    throw invalid_argument("--recommend needs the device memory (--gpu-mem), got {}", device_bytes);
  s.validate();
  const int64_t global_batch = static_cast<int64_t>(base.micro_batch) * base.grad_accum * base.dp;
  SearchResult res;
  // Context parallelism: cp ranks per sequence (ring, and Ulysses where the heads divide; the
  // base's own cp and method are among them).
  std::vector<std::pair<int, layout::CpMethod>> cps;
  for (int cp : divisors(world_size)) {
    cps.push_back({cp, layout::CpMethod::kRing});
    if (cp > 1) cps.push_back({cp, layout::CpMethod::kUlysses});
  }
  for (int tp : divisors(world_size)) {
    for (int pp : divisors(world_size / tp)) {
      for (const auto& [cp, method] : cps) {
        if ((world_size / (tp * pp)) % cp != 0) continue;
        const int dp = world_size / (tp * pp * cp);
        // Expert parallelism (a mixture of experts): every ep dividing the experts and dp x cp.
        std::vector<int> eps{1};
        if (model_spec::family_of(s).mlp == model_spec::MlpKind::kMoe) {
          eps.clear();
          for (int ep : divisors(dp * cp)) {
            if (s.num_local_experts % ep == 0) eps.push_back(ep);
          }
        }
        for (int ep : eps)
        for (int zero = 0; zero <= 3; ++zero) {
          for (int offload = 0; offload <= 2; ++offload) {  // none, optimizer, params + optimizer
            if ((offload == 1 && zero == 0) || (offload == 2 && zero != 3)) continue;
            if (offload > 0 && base.device == DeviceKind::kCpu) continue;  // nothing to offload to
            if (offload == 2) continue;  // the runtime offloads the optimizer, not ZeRO-3 params
            for (int ckpt = 0; ckpt <= 3; ++ckpt) {  // bit 0: checkpointing; bit 1: sequence parallelism
              if ((ckpt & 2) && tp == 1) continue;
              Layout l = base;
              l.sequence_parallel = (ckpt & 2) != 0;
              l.tp = tp;
              l.pp = pp;
              l.dp = dp;
              l.cp = cp;
              l.cp_method = method;
              l.ep = ep;
              l.zero_stage = zero;
              l.offload_optimizer = offload >= 1;
              l.offload_param = offload == 2;
              l.checkpointing = (ckpt & 1) != 0;
              if (global_batch % dp != 0) {
                ++res.considered;
                ++res.rejected_rule;  // train_batch_size must divide by dp
                continue;
              }
              for (int mb : divisors(global_batch / dp)) {
                ++res.considered;
                l.micro_batch = mb;
                l.grad_accum = static_cast<int>(global_batch / dp / mb);
                if (tp > cal.ranks_per_node) {  // tensor parallelism stays inside a node
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
                  c.time = step_time(s, l, cal, types);
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
