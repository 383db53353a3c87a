// The --json shapes of `dstrain plan` (plan_json.h), written field by field so that the order of
// the keys in the code is the order in the output.
#include "plan/plan_json.h"

#include <cmath>

namespace ds::plan {

Json paper_model_states_json(double params, int64_t world_size, int zero_stage,
                             const PaperModelStates& m) {
  Json j;
  j["formula"] = "paper";
  j["params"] = params;
  j["world_size"] = world_size;
  j["zero_stage"] = zero_stage;
  j["k"] = kZeroPaperK;
  j["per_gpu"] = {{"params", std::llround(m.params)},
                  {"grads", std::llround(m.grads)},
                  {"optimizer", std::llround(m.optimizer)},
                  {"total", std::llround(m.total())}};
  return j;
}

Json deepspeed_estimate_json(const DeepSpeedEstimateInput& in, const DeepSpeedEstimate& chosen,
                             const std::vector<DeepSpeedEstimate>& all) {
  auto row = [](const DeepSpeedEstimate& e) {
    return Json{{"options", e.options}, {"per_cpu", e.cpu_bytes}, {"per_gpu", e.gpu_bytes}};
  };
  Json j;
  j["formula"] = "deepspeed";
  j["zero_stage"] = in.stage;
  j["params"] = in.total_params;
  j["largest_layer_params"] = in.largest_layer_params;
  j["num_nodes"] = in.num_nodes;
  j["gpus_per_node"] = in.gpus_per_node;
  j["additional_buffer_factor"] = in.additional_buffer_factor;
  j["estimate"] = row(chosen);
  j["all_options"] = Json::array();
  for (const auto& e : all) j["all_options"].push_back(row(e));
  return j;
}

Json paper_activations_json(const KorthikantiView& v) {
  Json j;
  j["formula"] = "paper";
  j["source"] = "Korthikanti et al. 2022, Table 2 (16-bit activations)";
  j["s"] = v.s;
  j["b"] = v.b;
  j["h"] = v.h;
  j["a"] = v.a;
  j["t"] = v.t;
  j["layers"] = v.layers;
  j["pp"] = v.pp;
  j["rows"] = Json::array();
  for (const auto& r : v.rows) {
    Json row{{"name", r.name}, {"formula", r.formula}, {"per_layer", std::llround(r.layer_bytes)}};
    if (v.layers > 0) {
      row["first_stage"] =
          std::llround(r.layer_bytes * static_cast<double>(v.layer_micro_batches));
    }
    j["rows"].push_back(row);
  }
  return j;
}

Json layout_json(const Layout& l) {
  return Json{{"tp", l.tp},
              {"pp", l.pp},
              {"dp", l.dp},
              {"sequence_parallel", l.sequence_parallel},
              {"cp", l.cp},
              {"ep", l.ep},
              {"cp_method", layout::cp_method_name(l.cp_method)},
              {"zero_stage", l.zero_stage},
              {"micro_batch", l.micro_batch},
              {"gradient_accumulation_steps", l.grad_accum},
              {"activation_checkpointing", l.checkpointing},
              {"offload_optimizer", l.offload_optimizer ? "cpu" : "none"},
              {"offload_param", l.offload_param ? "cpu" : "none"},
              {"schedule", layout::schedule_name(l.schedule)},
              {"precision", layout::precision_name(l.precision)}};
}

Json rank_json(const RankMemory& r) {
  return Json{{"rank", r.rank},
              {"stage", r.stage},
              {"dp_rank", r.dp_rank},
              {"tp_rank", r.tp_rank},
              {"layers", {r.layer_begin, r.layer_end}},
              {"in_flight_micro_batches", r.in_flight},
              {"params", r.params},
              {"grads", r.grads},
              {"optimizer", r.optimizer},
              {"activations", r.activations},
              {"comm", r.comm},
              {"workspace", r.workspace},
              {"checkpoint", r.checkpoint},
              {"buffers", r.buffers()},
              {"total", r.total()},
              {"cpu", r.cpu}};
}

Json memory_plan_json(const std::string& config_path, const PlanInput& in, const MemoryPlan& p,
                      int64_t device_bytes) {
  const auto& s = in.shape;
  Json j;
  j["ranks"] = Json::array();
  for (const auto& r : p.ranks) j["ranks"].push_back(rank_json(r));
  j["config"] = config_path;
  j["world_size"] = in.layout.world_size();
  j["layout"] = layout_json(in.layout);
  j["model"] = {{"n_layer", s.n_layer},
                {"n_head", s.n_head},
                {"n_embd", s.n_embd},
                {"vocab_size", s.vocab_size},
                {"padded_vocab_size", s.padded_vocab_size},
                {"seq_len", s.seq_len},
                {"params", model_spec::param_count(s)}};
  j["stage_layers"] = p.bounds;
  j["distinct"] = Json::array();
  for (const auto& g : distinct_ranks(p)) {
    j["distinct"].push_back(
        {{"ranks", g.ranks_text}, {"stage", g.first->stage}, {"total", g.first->total()}});
  }
  j["peak"] = {{"rank", p.peak_rank().rank}, {"total", p.peak_total()}};
  if (device_bytes > 0) {
    auto v = verdict(p, device_bytes);
    j["device_bytes"] = device_bytes;
    j["verdict"] = {{"fits", v.fits}, {"margin", v.margin}, {"fixes", v.fixes}};
  } else {
    j["device_bytes"] = nullptr;
    j["verdict"] = nullptr;
  }
  return j;
}

Json hardware_json(const Hardware& hw) {
  return Json{{"gpu_flops", hw.gpu_flops},
              {"intra_node_bw", hw.intra_node_bw},
              {"layer_overhead", hw.layer_overhead},
              {"inter_node_bw", hw.inter_node_bw},
              {"pcie_bw", hw.pcie_bw},
              {"cpu_adam_rate", hw.cpu_adam_rate},
              {"gpus_per_node", hw.gpus_per_node}};
}

double time_to_train(const RecommendReport& report, const Candidate& c) {
  const double tokens_per_step = static_cast<double>(report.global_batch) * report.seq_len;
  return std::ceil(static_cast<double>(report.tokens) / tokens_per_step) * c.time.total();
}

Json recommend_json(const RecommendReport& report, const SearchResult& result) {
  Json j;
  j["config"] = report.config_path;
  j["world_size"] = report.world_size;
  j["device_bytes"] = report.device_bytes;
  j["global_batch"] = report.global_batch;
  j["considered"] = result.considered;
  j["fitting"] = result.fits.size();
  j["rejected_memory"] = result.rejected_memory;
  j["rejected_rule"] = result.rejected_rule;
  j["hardware"] = hardware_json(report.hardware);
  j["calibration"] = {{"source", report.calibration_source}, {"measured", report.calibrated}};
  if (report.tokens > 0) j["tokens"] = report.tokens;
  j["recommendations"] = Json::array();
  for (size_t i = 0; i < report.shown && i < result.fits.size(); ++i) {
    const auto& c = result.fits[i];
    Json e;
    e["layout"] = layout_json(c.layout);
    e["peak_bytes"] = c.peak_bytes;
    e["step_seconds"] = c.time.total();
    e["step"] = {{"compute", c.time.compute}, {"bubble", c.time.bubble},
                 {"tp_comm", c.time.tp_comm}, {"pp_comm", c.time.pp_comm},
                 {"cp_comm", c.time.cp_comm}, {"cp_comm_total", c.time.cp_comm_total},
                 {"ep_comm", c.time.ep_comm},
                 {"dp_comm", c.time.dp_comm}, {"offload", c.time.offload},
                 {"overhead", c.time.overhead}, {"recompute", c.time.recompute},
                 {"dp_comm_total", c.time.dp_comm_total}, {"optimizer", c.time.optimizer},
                 {"shared_cores", c.time.shared_cores}};
    e["reason"] = c.reason;
    e["predicted_ms"] = 1e3 * c.time.total();
    e["measured_ms"] = i < report.measured_ms.size() && report.measured_ms[i] > 0
                           ? Json(report.measured_ms[i]) : Json(nullptr);
    if (i + 1 < result.fits.size()) e["runner_up_trades"] = compare_steps(c, result.fits[i + 1]);
    if (report.tokens > 0) e["time_to_train_s"] = time_to_train(report, c);
    j["recommendations"].push_back(e);
  }
  return j;
}

}  // namespace ds::plan
