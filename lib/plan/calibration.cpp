// Reading and writing the calibration file (calibration.h). The reader walks the schema with a
// cursor that knows its JSON path, so every message names the file, line and path; nothing is
// defaulted silently.
#include "plan/calibration.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "common/error.h"
#include "config/json_reader.h"
#include "model_spec/family.h"

namespace ds::plan {

namespace {

using Json = nlohmann::ordered_json;

// A value of the document with its path, for messages.
class Cursor {
 public:
  Cursor(const config::JsonDocument& doc, const std::string& source, const Json& v, std::string path)
      : doc_(doc), source_(source), v_(v), path_(std::move(path)) {}

  [[noreturn]] void fail(const std::string& expected) const {
    const int line = doc_.line_of(path_);
    throw invalid_argument("{}{}: {}: expected {}, got {}", source_,
                           line > 0 ? fmt::format(":{}", line) : "", path_, expected,
                           v_.is_null() && !present_ ? "nothing (missing)" : v_.dump());
  }
  Cursor key(const std::string& k) const {
    if (!v_.is_object()) fail("an object");
    const std::string p = config::json_path_child(path_, k);
    auto it = v_.find(k);
    if (it == v_.end()) {
      Cursor c(doc_, source_, kNull, p);
      c.present_ = false;
      c.fail(fmt::format("key '{}'", k));
    }
    return Cursor(doc_, source_, *it, p);
  }
  bool has(const std::string& k) const { return v_.is_object() && v_.contains(k); }
  std::vector<Cursor> items(bool nonempty) const {
    if (!v_.is_array() || (nonempty && v_.empty())) fail(nonempty ? "a non-empty array" : "an array");
    std::vector<Cursor> out;
    for (size_t i = 0; i < v_.size(); ++i) out.emplace_back(doc_, source_, v_[i], config::json_path_index(path_, i));
    return out;
  }
  std::string str() const {
    if (!v_.is_string()) fail("a string");
    return v_.get<std::string>();
  }
  std::string one_of(std::initializer_list<const char*> names) const {
    const std::string s = v_.is_string() ? v_.get<std::string>() : "";
    std::string list;
    for (const char* n : names) {
      if (s == n) return s;
      list += fmt::format("{}\"{}\"", list.empty() ? "" : " | ", n);
    }
    fail(list);
  }
  int integer(int min) const {
    if (!v_.is_number_integer() || v_.get<int64_t>() < min || v_.get<int64_t>() > 1 << 30) {
      fail(fmt::format("an integer >= {}", min));
    }
    return static_cast<int>(v_.get<int64_t>());
  }
  double number(bool positive) const {
    if (!v_.is_number() || !std::isfinite(v_.get<double>()) || v_.get<double>() < 0 ||
        (positive && v_.get<double>() == 0)) {
      fail(positive ? "a number > 0" : "a number >= 0");
    }
    return v_.get<double>();
  }
  bool boolean() const {
    if (!v_.is_boolean()) fail("true or false");
    return v_.get<bool>();
  }
  bool is_null() const { return v_.is_null(); }

 private:
  static inline const Json kNull = nullptr;
  const config::JsonDocument& doc_;
  const std::string& source_;
  const Json& v_;
  std::string path_;
  bool present_ = true;
};

Precision precision_of(const std::string& s) {
  return s == "bf16" ? Precision::kBf16 : s == "fp16" ? Precision::kFp16 : Precision::kFp32;
}

CollectiveOp op_of(const std::string& s) {
  if (s == "all_reduce") return CollectiveOp::kAllReduce;
  if (s == "reduce_scatter") return CollectiveOp::kReduceScatter;
  if (s == "all_gather") return CollectiveOp::kAllGather;
  if (s == "all_to_all") return CollectiveOp::kAllToAll;
  if (s == "ring_exchange") return CollectiveOp::kRingExchange;
  return CollectiveOp::kSendRecv;
}

model_spec::ModelShape read_shape(const Cursor& m) {
  model_spec::ModelShape s;
  s.n_layer = m.key("n_layer").integer(1);
  s.n_head = m.key("n_head").integer(1);
  s.n_embd = m.key("n_embd").integer(1);
  s.vocab_size = m.key("vocab_size").integer(1);
  s.padded_vocab_size = m.key("padded_vocab_size").integer(1);
  s.seq_len = m.key("seq_len").integer(1);
  // The family and its own sizes (model_spec/family.h); files written before families were
  // recorded hold the default family's shapes (ModelShape's default).
  if (m.has("type")) {
    const Cursor t = m.key("type");
    const std::string name = t.str();
    const model_spec::FamilyDescription* f = model_spec::find_family(name);
    if (f == nullptr) t.fail("one of the model families (" + model_spec::family_names() + ")");
    s.family = f->family;
    // The family's own keys (FamilyDescription::keys): sizes and switches must be there; a number
    // that does not change the work (rope_theta, norm_eps) keeps its default when absent.
    for (const model_spec::FamilyKey& k : f->keys) {
      using Kind = model_spec::FamilyKey::Kind;
      if (k.kind == Kind::kInt) s.*k.int_field = m.key(k.key).integer(1);
      if (k.kind == Kind::kBool) s.*k.bool_field = m.key(k.key).boolean();
      if (k.kind == Kind::kNumber && m.has(k.key)) s.*k.number_field = m.key(k.key).number(true);
    }
  }
  return s;
}

ComputeSample read_compute(const Cursor& c) {
  ComputeSample x;
  x.tp = c.key("tp").integer(1);
  x.concurrency = c.key("concurrency").integer(1);
  x.micro_batch = c.key("micro_batch").integer(1);
  x.precision = precision_of(c.key("precision").one_of({"fp32", "bf16", "fp16"}));
  x.layer_fwd = c.key("layer_fwd_s").number(true);
  x.layer_bwd = c.key("layer_bwd_s").number(true);
  x.embed_fwd = c.key("embed_fwd_s").number(false);
  x.embed_bwd = c.key("embed_bwd_s").number(false);
  x.head = c.key("head_s").number(false);
  return x;
}

CollectiveFit read_collective(const Cursor& c) {
  CollectiveFit f;
  f.op = op_of(c.key("op").one_of({"all_reduce", "reduce_scatter", "all_gather", "send_recv", "all_to_all", "ring_exchange"}));
  f.group_size = c.key("group_size").integer(2);
  f.concurrent_groups = c.key("concurrent_groups").integer(1);
  f.across_nodes = c.key("across_nodes").boolean();
  f.latency = c.key("latency_s").number(false);
  f.bus_bw = c.key("bus_bytes_per_s").number(true);
  for (const auto& p : c.key("points").items(false)) {
    f.points.emplace_back(p.key("bytes").number(true), p.key("seconds").number(true));
  }
  return f;
}

}  // namespace

CalibrationFile parse_calibration(const std::string& text, const std::string& source) {
  const config::JsonDocument doc = config::parse_json(text, source);
  const Cursor root(doc, source, doc.value, "$");
  if (root.key("format").str() != "dstrain-calibration") root.key("format").fail("\"dstrain-calibration\"");
  if (root.key("version").integer(1) != 1) root.key("version").fail("1");
  CalibrationFile f;
  Calibration& c = f.cal;
  c.source = source;
  c.measured = true;
  f.meta.host = root.key("host").str();
  f.meta.device = root.key("device").one_of({"cpu", "cuda"});
  f.meta.backend = root.key("backend").one_of({"shm", "gloo", "nccl"});
  f.meta.nodes = root.key("nodes").integer(1);
  c.cpu = f.meta.device == "cpu";
  c.ranks_per_node = root.key("ranks_per_node").integer(1);
  c.cores = root.key("cores").integer(0);
  c.threads_per_rank = root.key("threads_per_rank").integer(1);
  c.shape = read_shape(root.key("model"));
  for (const auto& x : root.key("compute").items(true)) c.compute.push_back(read_compute(x));
  for (const auto& x : root.key("collectives").items(false)) c.collectives.push_back(read_collective(x));
  c.optimizer_rate = root.key("optimizer_params_per_s").number(true);
  const Cursor link = root.key("host_link_bytes_per_s");
  if (!link.is_null()) c.host_link_bw = link.number(true);
  c.cpu_adam_rate = root.key("cpu_adam_params_per_s").number(true);
  c.step_overhead = root.key("step_overhead_s").number(false);
  return f;
}

CalibrationFile read_calibration(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw Error(ErrorKind::kInvalidArgument, fmt::format("calibration file {}: {}", path, errno_string(errno)),
                "write one with dstrain plan --calibrate -o " + path);
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_calibration(ss.str(), path);
}

Json calibration_json(const Calibration& c, const CalibrationMeta& meta) {
  Json j;
  j["format"] = "dstrain-calibration";
  j["version"] = 1;
  j["host"] = meta.host;
  j["device"] = meta.device;
  j["backend"] = meta.backend;
  j["nodes"] = meta.nodes;
  j["ranks_per_node"] = c.ranks_per_node;
  j["cores"] = c.cores;
  j["threads_per_rank"] = c.threads_per_rank;
  const model_spec::FamilyDescription& family = model_spec::family_of(c.shape);
  j["model"] = {{"type", family.name},
                {"n_layer", c.shape.n_layer},
                {"n_head", c.shape.n_head},
                {"n_embd", c.shape.n_embd},
                {"vocab_size", c.shape.vocab_size},
                {"padded_vocab_size", c.shape.padded_vocab_size},
                {"seq_len", c.shape.seq_len}};
  for (const model_spec::FamilyKey& k : family.keys) {
    using Kind = model_spec::FamilyKey::Kind;
    if (k.kind == Kind::kInt) j["model"][k.key] = c.shape.*k.int_field;
    if (k.kind == Kind::kNumber) j["model"][k.key] = c.shape.*k.number_field;
    if (k.kind == Kind::kBool) j["model"][k.key] = c.shape.*k.bool_field;
  }
  j["compute"] = Json::array();
  for (const auto& x : c.compute) {
    j["compute"].push_back({{"tp", x.tp}, {"concurrency", x.concurrency}, {"micro_batch", x.micro_batch},
                            {"precision", layout::precision_name(x.precision)},
                            {"layer_fwd_s", x.layer_fwd}, {"layer_bwd_s", x.layer_bwd},
                            {"embed_fwd_s", x.embed_fwd}, {"embed_bwd_s", x.embed_bwd}, {"head_s", x.head}});
  }
  j["collectives"] = Json::array();
  for (const auto& f : c.collectives) {
    Json pts = Json::array();
    for (const auto& [b, s] : f.points) pts.push_back({{"bytes", b}, {"seconds", s}});
    j["collectives"].push_back({{"op", collective_name(f.op)}, {"group_size", f.group_size},
                                {"concurrent_groups", f.concurrent_groups},
                                {"across_nodes", f.across_nodes}, {"latency_s", f.latency},
                                {"bus_bytes_per_s", f.bus_bw}, {"points", pts}});
  }
  j["optimizer_params_per_s"] = c.optimizer_rate;
  j["host_link_bytes_per_s"] = c.cpu ? Json(nullptr) : Json(c.host_link_bw);
  j["cpu_adam_params_per_s"] = c.cpu_adam_rate;
  j["step_overhead_s"] = c.step_overhead;
  return j;
}

CollectiveFit fit_collective(CollectiveOp op, int group_size, int concurrent_groups,
                             bool across_nodes, const std::vector<std::pair<double, double>>& points) {
  if (points.empty()) throw invalid_argument("fit_collective: no points for {}", collective_name(op));
  CollectiveFit f{op, group_size, concurrent_groups, across_nodes, 0, 0, points};
  // Weighted by 1 / seconds^2, i.e. least squares in relative error: every size counts alike,
  // so one disturbed point in the middle does not hand the small sizes the large one's error
  // (a 1 MiB point 5x slow once made a 390 us latency out of a 70 us one).
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& [bytes, sec] : points) {
    const double x = bus_bytes(op, group_size, bytes);
    const double w = sec > 0 ? 1.0 / (sec * sec) : 1.0;
    sw += w, sx += w * x, sy += w * sec, sxx += w * x * x, sxy += w * x * sec;
  }
  const double den = sw * sxx - sx * sx;
  double slope = den > 0 ? (sw * sxy - sx * sy) / den : 0;
  double icpt = den > 0 ? (sy - slope * sx) / sw : 0;
  if (slope <= 0 || icpt < 0) {  // through the origin at the largest point's rate
    icpt = std::max(0.0, icpt);
    const auto& big = points.back();
    slope = std::max(1e-15, (big.second - icpt) / bus_bytes(op, group_size, big.first));
  }
  f.latency = icpt;
  f.bus_bw = 1.0 / slope;
  return f;
}

}  // namespace ds::plan
