// The step-time model; its formulas are in step_time.h and docs/planning.md. The lookups pick
// the measured sample nearest what a layout needs and say nothing when the calibration had it
// exactly; every fallback (another tp, another precision, another model shape) rescales by FLOPs.
#include "plan/step_time.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "layout/pipeline_schedule.h"
#include "model_spec/family.h"
#include "model_spec/flops.h"

namespace ds::plan {

namespace {

// FLOPs of one sequence through one layer's forward and the head (fwd + bwd): model_spec/flops.h,
// from the family's own tensors.
double layer_flops(const model_spec::ModelShape& s) { return model_spec::layer_forward_flops(s, s.seq_len); }
double head_flops(const model_spec::ModelShape& s) { return model_spec::head_flops(s, s.seq_len); }
double embed_elems(const model_spec::ModelShape& s) {
  return static_cast<double>(s.seq_len) * s.n_embd;
}

PieceTimes builtin_pieces(const Calibration& cal, const model_spec::ModelShape& s, int tp, int b) {
  PieceTimes p;
  const double f = b * layer_flops(s) / tp / cal.flops;
  p.layer_fwd = f + cal.layer_overhead / 3;
  p.layer_bwd = 2 * f + 2 * cal.layer_overhead / 3;
  p.head = b * head_flops(s) / tp / cal.flops;
  return p;
}

PieceTimes of(const ComputeSample& c) {
  return {c.layer_fwd, c.layer_bwd, c.embed_fwd, c.embed_bwd, c.head, false};
}

PieceTimes lerp(const PieceTimes& a, const PieceTimes& b, double w) {
  auto mix = [w](double x, double y) { return x + (y - x) * w; };
  return {mix(a.layer_fwd, b.layer_fwd), mix(a.layer_bwd, b.layer_bwd),
          mix(a.embed_fwd, b.embed_fwd), mix(a.embed_bwd, b.embed_bwd), mix(a.head, b.head), false};
}

PieceTimes scale(PieceTimes p, double layer, double head, double embed) {
  p.layer_fwd *= layer;
  p.layer_bwd *= layer;
  p.head *= head;
  p.embed_fwd *= embed;
  p.embed_bwd *= embed;
  return p;
}

// The samples of one (tp, precision, concurrency), sorted by micro-batch.
std::vector<ComputeSample> pick_samples(const Calibration& cal, int tp, Precision precision,
                                        int concurrency, bool* tp_exact) {
  auto has = [&](auto pred) {
    return std::any_of(cal.compute.begin(), cal.compute.end(), pred);
  };
  const bool prec_ok = has([&](const ComputeSample& c) { return c.precision == precision; });
  const Precision want_prec = prec_ok ? precision : cal.compute.front().precision;
  *tp_exact = has([&](const ComputeSample& c) { return c.tp == tp && c.precision == want_prec; });
  const int want_tp = *tp_exact ? tp : 1;
  int best = -1, smallest = std::numeric_limits<int>::max();
  for (const auto& c : cal.compute) {
    if (c.tp != want_tp || c.precision != want_prec) continue;
    if (c.concurrency <= concurrency) best = std::max(best, c.concurrency);
    smallest = std::min(smallest, c.concurrency);
  }
  const int conc = best > 0 ? best : smallest;
  std::vector<ComputeSample> out;
  for (const auto& c : cal.compute) {
    if (c.tp == want_tp && c.precision == want_prec && c.concurrency == conc) out.push_back(c);
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.micro_batch < b.micro_batch; });
  return out;
}

PieceTimes interpolate(const std::vector<ComputeSample>& v, int b) {
  if (v.size() == 1 || b <= v.front().micro_batch) {
    const auto& c = b <= v.front().micro_batch ? v.front() : v.back();
    return scale(of(c), 1.0 * b / c.micro_batch, 1.0 * b / c.micro_batch, 1.0 * b / c.micro_batch);
  }
  for (size_t i = 1; i < v.size(); ++i) {
    if (b <= v[i].micro_batch) {
      const double w = 1.0 * (b - v[i - 1].micro_batch) / (v[i].micro_batch - v[i - 1].micro_batch);
      return lerp(of(v[i - 1]), of(v[i]), w);
    }
  }
  const double k = 1.0 * b / v.back().micro_batch;  // per sequence beyond the largest measured
  return scale(of(v.back()), k, k, k);
}

bool same_shape(const model_spec::ModelShape& a, const model_spec::ModelShape& b) {
  return a.family == b.family && a.n_embd == b.n_embd && a.seq_len == b.seq_len && a.n_head == b.n_head &&
         model_spec::kv_heads(a) == model_spec::kv_heads(b) && model_spec::mlp_width(a) == model_spec::mlp_width(b) &&
         a.padded_vocab_size == b.padded_vocab_size;
}

}  // namespace

const char* collective_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllReduce: return "all_reduce";
    case CollectiveOp::kReduceScatter: return "reduce_scatter";
    case CollectiveOp::kAllGather: return "all_gather";
    case CollectiveOp::kSendRecv: return "send_recv";
    case CollectiveOp::kAllToAll: return "all_to_all";
    case CollectiveOp::kRingExchange: return "ring_exchange";
  }
  return "?";
}

double bus_bytes(CollectiveOp op, int n, double bytes) {
  switch (op) {
    case CollectiveOp::kAllReduce: return bytes * 2.0 * (n - 1) / n;
    case CollectiveOp::kReduceScatter:
    case CollectiveOp::kAllGather:
    case CollectiveOp::kAllToAll: return bytes * (n - 1.0) / n;
    case CollectiveOp::kSendRecv:
    case CollectiveOp::kRingExchange: return bytes;
  }
  return bytes;
}

double collective_seconds(const CollectiveFit& f, double bytes) {
  return f.latency + bus_bytes(f.op, f.group_size, bytes) / f.bus_bw;
}

PieceTimes compute_for(const Calibration& cal, const model_spec::ModelShape& s, int tp, int b,
                       Precision precision, int concurrency) {
  if (cal.compute.empty()) return builtin_pieces(cal, s, tp, b);
  bool tp_exact = true;
  PieceTimes p = interpolate(pick_samples(cal, tp, precision, concurrency, &tp_exact), b);
  double layer = 1, head = 1, embed = 1;
  if (!tp_exact) layer = head = 1.0 / tp;
  if (!same_shape(cal.shape, s)) {
    layer *= layer_flops(s) / layer_flops(cal.shape);
    head *= head_flops(s) / head_flops(cal.shape);
    embed *= embed_elems(s) / embed_elems(cal.shape);
    p.scaled = true;
  }
  return scale(p, layer, head, embed);
}

double collective_time(const Calibration& cal, CollectiveOp op, int group_size, bool across_nodes,
                       int concurrent_groups, double bytes) {
  if (group_size <= 1 || bytes <= 0) return 0;
  const CollectiveFit* best = nullptr;
  double best_cost = 0;
  for (const auto& f : cal.collectives) {
    if (f.op != op) continue;
    // Placement first, then the group size, then the concurrency.
    const double cost = (f.across_nodes != across_nodes) * 1e6 +
                        std::fabs(std::log2(1.0 * f.group_size / group_size)) * 1e3 +
                        std::fabs(std::log2(1.0 * f.concurrent_groups / concurrent_groups));
    if (!best || cost < best_cost) {
      best = &f;
      best_cost = cost;
    }
  }
  if (best) {
    CollectiveFit f = *best;
    f.group_size = group_size;  // the bus-bytes factor of the size asked for
    return collective_seconds(f, bytes);
  }
  const bool sends_only = op == CollectiveOp::kAllToAll || op == CollectiveOp::kRingExchange;
  if (sends_only && std::any_of(cal.collectives.begin(), cal.collectives.end(),
                                [](const CollectiveFit& f) { return f.op == CollectiveOp::kSendRecv; })) {
    const int pairs = std::max(1, group_size * concurrent_groups / 2);
    return collective_time(cal, CollectiveOp::kSendRecv, 2, across_nodes, pairs, bus_bytes(op, group_size, bytes));
  }
  const double bw = across_nodes ? cal.inter_node_bw : cal.intra_node_bw;
  return bus_bytes(op, group_size, bytes) / bw;
}

CommTypes comm_types(Precision storage, Precision grad_type, bool cuda) {
  return {param_bytes(layout::stored_precision(storage, cuda)), param_bytes(layout::stored_precision(grad_type, cuda))};
}

double pipeline_schedule(const std::vector<double>& slots, int m) {
  double sum = 0, mx = 0;
  for (double t : slots) {
    sum += t;
    mx = std::max(mx, t);
  }
  return sum + (m - 1) * mx;
}

namespace {

// A stage's compute events in the runtime's order (layout/pipeline_schedule.h, the list the
// runtime's driver walks): forward mb = +(mb + 1), backward mb = -(mb + 1).
std::vector<int> stage_order(PipelineSchedule schedule, int stages, int stage, int m) {
  std::vector<int> out;
  for (const layout::Event& e : layout::stage_events(schedule, stages, stage, m)) {
    if (e.kind == layout::EventKind::kForward) out.push_back(e.mb + 1);
    if (e.kind == layout::EventKind::kBackward) out.push_back(-(e.mb + 1));
  }
  return out;
}

}  // namespace

double shared_core_pipeline(const std::vector<StageWork>& stages, int m, PipelineSchedule schedule,
                            double handoff, int ranks_per_stage,
                            const std::function<double(int)>& capacity) {
  const int p = static_cast<int>(stages.size());
  if (p == 0 || m < 1) return 0;
  constexpr double kNever = std::numeric_limits<double>::infinity();
  std::vector<std::vector<int>> order(static_cast<size_t>(p));
  for (int s = 0; s < p; ++s) order[static_cast<size_t>(s)] = stage_order(schedule, p, s, m);
  // done[s][2 mb + (0 fwd | 1 bwd)]: when that event ended on stage s (kNever: not yet).
  std::vector<std::vector<double>> done(static_cast<size_t>(p), std::vector<double>(2 * static_cast<size_t>(m), kNever));
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  std::vector<double> left(static_cast<size_t>(p), 0);  // work left of the running event, alone-speed seconds
  std::vector<bool> running(static_cast<size_t>(p), false);
  // When stage s may start its next event: its input's producer ended + handoff (kNever: not yet).
  auto ready_at = [&](int s) {
    const int ev = order[static_cast<size_t>(s)][next[static_cast<size_t>(s)]];
    const int mb = std::abs(ev) - 1;
    if (ev > 0) return s == 0 ? 0.0 : done[static_cast<size_t>(s) - 1][2 * static_cast<size_t>(mb)] + handoff;
    if (s == p - 1) return done[static_cast<size_t>(s)][2 * static_cast<size_t>(mb)];  // its own forward
    return done[static_cast<size_t>(s) + 1][2 * static_cast<size_t>(mb) + 1] + handoff;
  };
  double now = 0;
  int finished = 0;
  while (finished < p) {
    int active = 0;
    for (int s = 0; s < p; ++s) {  // start what can start
      const auto i = static_cast<size_t>(s);
      if (!running[i] && next[i] < order[i].size() && ready_at(s) <= now) {
        running[i] = true;
        left[i] = order[i][next[i]] > 0 ? stages[i].fwd : stages[i].bwd;
      }
      active += running[i];
    }
    const int k = active * ranks_per_stage;
    const double rate = k > 0 ? std::min(1.0, capacity(k) / k) : 1.0;
    double step = kNever;
    for (int s = 0; s < p; ++s) {
      const auto i = static_cast<size_t>(s);
      if (running[i]) step = std::min(step, left[i] / rate);
      else if (next[i] < order[i].size()) step = std::min(step, ready_at(s) - now);
    }
    if (!(step < kNever)) break;  // nothing can move: cannot happen for these schedules
    step = std::max(0.0, step);
    now += step;
    for (int s = 0; s < p; ++s) {
      const auto i = static_cast<size_t>(s);
      if (!running[i]) continue;
      left[i] -= step * rate;
      if (left[i] > 1e-12 * std::max(1.0, now)) continue;
      const int ev = order[i][next[i]];
      done[i][2 * static_cast<size_t>(std::abs(ev) - 1) + (ev < 0)] = now;
      running[i] = false;
      if (++next[i] == order[i].size()) ++finished;
    }
  }
  return now;
}

double exposed_comm(double total, int buckets, double window, double overlap) {
  if (total <= 0) return 0;
  if (overlap <= 0) return total;
  return std::max(total / std::max(1, buckets), total - window * overlap);
}

namespace {

// Where the layout's ranks sit and whether a collective can run beside the compute.
struct Placement {
  int world = 1, per_node = 1;
  double overlap = 1;   // 1: a collective runs beside the compute; 0: it takes the compute's core
};

Placement placement(const Layout& l, const Calibration& cal) {
  Placement p;
  p.world = l.world_size();
  p.per_node = std::max(1, std::min(p.world, cal.ranks_per_node));
  const int threads = std::max(1, cal.threads_per_rank);
  if (cal.cpu && cal.cores > 0) p.overlap = cal.cores >= 2 * p.per_node * threads ? 1 : 0;
  return p;
}

// How many ranks' worth of compute the node delivers when `ranks` compute at once: ranks x
// t(alone) / t(together), from the samples at the largest measured concurrency <= ranks. A
// GPU node (or a CPU calibration without concurrency samples) delivers every rank's.
double node_capacity(const Calibration& cal, const model_spec::ModelShape& s, const Layout& l, int ranks) {
  if (!cal.cpu || cal.compute.empty()) return ranks;
  int conc = 1;
  for (const auto& c : cal.compute) {
    if (c.concurrency <= ranks) conc = std::max(conc, c.concurrency);
  }
  if (conc == 1) {  // not measured together: assume the cores, one rank per core's worth of threads
    const int slots = cal.cores > 0 ? std::max(1, cal.cores / std::max(1, cal.threads_per_rank)) : ranks;
    return std::min(ranks, slots);
  }
  const PieceTimes alone = compute_for(cal, s, l.tp, l.micro_batch, l.precision, 1);
  const PieceTimes together = compute_for(cal, s, l.tp, l.micro_batch, l.precision, conc);
  const double ratio = (alone.layer_fwd + alone.layer_bwd) / (together.layer_fwd + together.layer_bwd);
  return std::min<double>(ranks, conc * ratio);
}

// One pipeline stage's micro-batch, split by kind.
struct StageMb {
  double fwd = 0, bwd = 0, recompute = 0, tp = 0, p2p = 0, params = 0;
  double cp = 0, cp_total = 0;  // context parallelism's exposed and total transfer time
  double tp_fwd = 0;   // of tp, the forward's all-reduces
  double handoff = 0;  // one send/recv to a neighbour stage
  int layers = 0;
  double ep = 0;        // expert parallelism's all-to-alls
  double slot() const { return fwd + bwd + tp + p2p + cp + ep; }
};

// One layer's context-parallel traffic on a rank, forward and backward (recompute: the forward's
// again), with how much of it the compute hides. Ring: N-1 key/value blocks in the forward; in
// the backward N-1 blocks and N fp32 dK/dV accumulators, each a ring_exchange overlapping the
// block attention of the step (window: the layer's compute of that pass split over the N steps).
// Ulysses: all-to-alls (2 forward, 4 backward) of the rank's rows of that tensor, (N-1)/N of
// which leave the rank; nothing overlaps them.
struct CpLayer {
  double exposed = 0, total = 0;
};
CpLayer cp_layer(const model_spec::ModelShape& s, const Layout& l, const Calibration& cal, const Placement& pl,
                 const CommTypes& types, double fwd, double bwd, double r) {
  CpLayer c;
  if (l.cp <= 1) return c;
  const int n = l.cp;
  const bool across = l.tp * l.cp > pl.per_node;
  const double rows = 1.0 * l.micro_batch * s.seq_len / n;  // the rank's tokens of each micro-batch
  const double hd = s.head_dim(), nh = 1.0 * s.n_head / l.tp, kv = 1.0 * model_spec::kv_heads(s) / l.tp;
  const int groups = std::max(1, pl.world / n);
  if (l.cp_method == layout::CpMethod::kRing) {
    auto step = [&](double bytes) {
      return collective_time(cal, CollectiveOp::kRingExchange, n, across, groups, bytes);
    };
    const double block = rows * 2 * kv * hd;  // elements of the rank's keys and values
    const double f = (n - 1) * step(block * types.param_bytes);
    const double b = (n - 1) * step(block * types.param_bytes) + n * step(block * 4);
    c.total = (1 + r) * f + b;
    c.exposed = (1 + r) * exposed_comm(f, n - 1, fwd, pl.overlap) + exposed_comm(b, 2 * n - 1, bwd, pl.overlap);
    return c;
  }
  auto all_to_all = [&](double bytes) {
    return collective_time(cal, CollectiveOp::kAllToAll, n, across, groups, bytes);
  };
  const double qkv = rows * (nh + 2 * kv) * hd * types.param_bytes, out = rows * nh * hd * types.param_bytes;
  const double f = all_to_all(qkv) + all_to_all(out);
  const double b = all_to_all(qkv) + 3 * all_to_all(out) + all_to_all(qkv);  // qkv, out, dout in; dqkv out
  c.total = c.exposed = (1 + r) * f + b;
  return c;
}

// One layer's expert-parallel traffic on a rank, forward and backward (recompute: the forward's
// dispatch again), as the runtime exchanges it (runtime/model/decoder.cpp, moe_*_ep): the B T k
// routed rows to their experts' ranks and the outputs back in the forward; d(out) to the experts
// and d(in) back, with the routing weights and their gradients (fp32), in the backward. On
// average (ep-1)/ep of the rows leave the rank (balanced routing: all_to_all's bus bytes), and
// nothing overlaps the all-to-alls.
double ep_layer(const model_spec::ModelShape& s, const Layout& l, const Calibration& cal, const Placement& pl,
                const CommTypes& types, double r) {
  if (l.ep <= 1 || model_spec::family_of(s).mlp != model_spec::MlpKind::kMoe) return 0;
  const double slots = 1.0 * l.micro_batch * s.seq_len / l.cp * s.num_experts_per_tok;
  const bool across = l.tp * l.cp * l.ep > pl.per_node;
  auto all_to_all = [&](double bytes) {
    return collective_time(cal, CollectiveOp::kAllToAll, l.ep, across, std::max(1, pl.world / l.ep), bytes);
  };
  const double rows = all_to_all(slots * s.n_embd * types.param_bytes);
  const double floats = all_to_all(slots * 4);
  return (2 + r) * rows + 2 * rows + 2 * floats;
}

std::vector<StageMb> stage_micro_batches(const model_spec::ModelShape& s, const Layout& l,
                                         const Calibration& cal, const Placement& pl,
                                         const CommTypes& types) {
  const std::vector<int> bounds = stage_bounds(s, l.pp, l.partition, l.tp);
  // A cp rank computes 1/cp of every piece (its T/cp tokens; the ring's chunks balance the causal
  // attention, Ulysses gives it 1/cp of the heads over the whole sequence).
  const PieceTimes pc = scale(compute_for(cal, s, l.tp, l.micro_batch, l.precision, 1), 1.0 / l.cp, 1.0 / l.cp,
                              1.0 / l.cp);
  const double act = 1.0 * l.micro_batch * s.seq_len / l.cp * s.n_embd * types.param_bytes;
  const double ar = collective_time(cal, CollectiveOp::kAllReduce, l.tp, false, pl.world / l.tp, act);
  const double p2p = l.pp > 1 ? collective_time(cal, CollectiveOp::kSendRecv, 2, pl.world > pl.per_node,
                                                pl.world / 2, act)
                              : 0;
  const double r = l.checkpointing ? 1 : 0;
  std::vector<StageMb> out;
  for (int st = 0; st < l.pp; ++st) {
    const double n = bounds[static_cast<size_t>(st) + 1] - bounds[static_cast<size_t>(st)];
    const bool first = st == 0, last = st == l.pp - 1;
    StageMb m;
    m.layers = static_cast<int>(n);
    m.fwd = n * pc.layer_fwd + first * pc.embed_fwd;
    m.recompute = n * r * pc.layer_fwd;
    m.bwd = n * pc.layer_bwd + m.recompute + last * pc.head + first * pc.embed_bwd;
    m.tp_fwd = (2 * n + first) * ar;
    m.tp = m.tp_fwd + (2 * n * (1 + r) + last) * ar;
    m.p2p = last ? 0 : 2 * p2p;
    m.handoff = p2p;
    const CpLayer cpl = cp_layer(s, l, cal, pl, types, pc.layer_fwd, pc.layer_bwd, r);
    m.cp = n * cpl.exposed;
    m.cp_total = n * cpl.total;
    m.ep = n * ep_layer(s, l, cal, pl, types, r);
    // Expert parallelism: a rank holds (and reduces, updates) E/ep of the experts.
    model_spec::ModelPart part{bounds[static_cast<size_t>(st)], bounds[static_cast<size_t>(st) + 1],
                               first, last, l.tp, 0, l.ep, 0};
    m.params = static_cast<double>(model_spec::part_param_count(s, part));
    out.push_back(m);
  }
  return out;
}

// Buckets of `elems` in chunks of `cap` elements: calls and the bytes of one.
struct Buckets {
  int count = 1;
  double bytes = 0;
};
Buckets buckets(double elems, int64_t cap, int elem_bytes) {
  Buckets b;
  const double c = std::max<double>(1, static_cast<double>(cap));
  b.count = std::max(1, static_cast<int>(std::ceil(elems / c)));
  b.bytes = elems / b.count * elem_bytes;
  return b;
}

// The data-parallel traffic of the critical stage: sets dp_comm (exposed) and dp_comm_total.
void data_parallel(const Layout& l, const Calibration& cal, const Placement& pl,
                   const CommTypes& types, const StageMb& st, StepTime& t) {
  const int zr = l.zero_ranks();  // gradients are reduced over dp x cp
  if (zr <= 1) return;
  const bool across = l.tp * zr > pl.per_node;
  const int groups = pl.world / zr;
  const double ov = l.overlap_comm ? pl.overlap : 0;
  const double n = st.params, m = l.grad_accum, r = l.checkpointing ? 1 : 0;
  auto coll = [&](CollectiveOp op, const Buckets& b) {
    return b.count * collective_time(cal, op, zr, across, groups, b.bytes);
  };
  const Buckets grad = buckets(n, l.reduce_bucket_size, types.grad_bytes);
  double exposed = 0, total = 0;
  if (l.zero_stage <= 1) {
    total = coll(CollectiveOp::kAllReduce, grad);
    exposed = exposed_comm(total, grad.count, st.bwd, ov);
  } else {
    const double rs = coll(CollectiveOp::kReduceScatter, grad);
    double fwd_g = 0, bwd_g = 0;
    int units = 0;
    if (l.zero_stage == 3) {  // one gather per unit (layer, embeddings), prefetched
      units = st.layers + 2;
      fwd_g = coll(CollectiveOp::kAllGather, {units, n / units * types.param_bytes});
      bwd_g = (1 + r) * fwd_g;
    }
    total = m * (rs + fwd_g + bwd_g);
    exposed = m * (exposed_comm(fwd_g, units, st.fwd, ov) +
                   exposed_comm(rs + bwd_g, grad.count + units, st.bwd, ov));
  }
  if (l.zero_stage == 1 || l.zero_stage == 2) {  // the updated parameters, gathered after the step
    const Buckets ag = buckets(n, l.allgather_bucket_size * zr, types.param_bytes);
    const double g = coll(CollectiveOp::kAllGather, ag);
    total += g;
    exposed += g;
  }
  t.dp_comm = exposed;
  t.dp_comm_total = total;
}

}  // namespace

StepTime step_time(const model_spec::ModelShape& s, const Layout& l, const Calibration& cal,
                   const CommTypes& types) {
  StepTime t;
  const Placement pl = placement(l, cal);
  const std::vector<StageMb> stages = stage_micro_batches(s, l, cal, pl, types);
  std::vector<double> slots;
  size_t crit = 0;
  for (size_t i = 0; i < stages.size(); ++i) {
    slots.push_back(stages[i].slot());
    if (slots[i] > slots[crit]) crit = i;
  }
  const StageMb& st = stages[crit];
  const double m = l.grad_accum;
  t.compute = m * (st.fwd + st.bwd);
  t.recompute = m * st.recompute;
  t.tp_comm = m * st.tp;
  t.pp_comm = m * st.p2p;
  t.cp_comm = m * st.cp;
  t.cp_comm_total = m * st.cp_total;
  t.ep_comm = m * st.ep;
  const double schedule = pipeline_schedule(slots, l.grad_accum);
  t.bubble = schedule - m * st.slot();
  data_parallel(l, cal, pl, types, st, t);
  const double shard = l.zero_stage == 0 ? st.params : std::ceil(st.params / l.zero_ranks());
  if (l.offload_optimizer && !cal.cpu) {
    t.offload = 2 * shard * types.param_bytes / cal.host_link_bw + shard / cal.cpu_adam_rate;
  } else {
    t.optimizer = shard / cal.optimizer_rate;
  }
  t.overhead = cal.step_overhead;
  // The node's compute (every rank's, at the rate of a rank alone) through what the node
  // delivers with all its ranks at once; tp all-reduces keep a whole group waiting.
  double work = 0;
  for (const auto& x : stages) work += l.tp * l.dp * l.cp * m * (x.fwd + x.bwd);
  work *= 1.0 * pl.per_node / pl.world;
  const double bound = work / node_capacity(cal, s, l, pl.per_node) + t.tp_comm + t.cp_comm + t.ep_comm + t.dp_comm +
                       t.optimizer + t.offload + t.overhead;
  t.shared_cores = std::max(0.0, bound - t.total());
  if (l.pp > 1) {  // a pipeline's stages share the cores only while they compute at once
    std::vector<StageWork> work_of;
    for (const auto& x : stages) work_of.push_back({x.fwd + x.tp_fwd, x.bwd + x.tp - x.tp_fwd});
    const int per_stage =
        std::max(1, static_cast<int>(std::lround(1.0 * l.tp * l.dp * l.cp * pl.per_node / pl.world)));
    std::vector<double> capacity(static_cast<size_t>(pl.per_node) + 1, 0);  // by ranks computing, looked up once
    for (int k = 1; k <= pl.per_node; ++k) capacity[static_cast<size_t>(k)] = node_capacity(cal, s, l, k);
    const double shared = shared_core_pipeline(work_of, l.grad_accum, l.schedule, st.handoff, per_stage,
                                               [&](int k) { return capacity[static_cast<size_t>(std::min(k, pl.per_node))]; });
    t.shared_cores = std::max(t.shared_cores, shared - schedule);
  }
  return t;
}

}  // namespace ds::plan
