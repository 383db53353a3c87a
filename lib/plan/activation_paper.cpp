// Korthikanti et al. 2022, Table 2, evaluated. Formulas in activation_paper.h.
#include "plan/activation_paper.h"

#include <cmath>

#include "common/error.h"

namespace ds::plan {

namespace {

void check(double v, const char* what) {
  if (!(v > 0) || !std::isfinite(v)) throw invalid_argument("{} must be positive, got {}", what, v);
}

bool divides(double t, double x) { return std::fmod(x, t) == 0; }

}  // namespace

double korthikanti_layer_bytes(const KorthikantiInput& in) {
  check(in.s, "sequence length (--seq-len)");
  check(in.b, "micro-batch size (--micro-batch)");
  check(in.h, "hidden size (--hidden)");
  check(in.a, "attention heads (--heads)");
  check(in.t, "tensor-parallel size (--tp)");
  if (!divides(in.t, in.h) || !divides(in.t, in.a)) {
    throw invalid_argument("tensor-parallel size {} must divide the hidden size {} and the heads {}",
                           in.t, in.h, in.a);
  }
  if (in.sequence_parallel && in.t <= 1) {
    throw invalid_argument("sequence parallelism needs a tensor-parallel size above 1, got {}", in.t);
  }
  const double sbh = in.s * in.b * in.h;
  const double scores = 5 * in.a * in.s / (in.h * in.t);  // 5as/(ht)
  switch (in.recompute) {
    case PaperRecompute::kFull:
      return 2 * sbh;
    case PaperRecompute::kSelective:
      return in.sequence_parallel ? sbh * (34 / in.t) : sbh * (10 + 24 / in.t);
    case PaperRecompute::kNone:
      break;
  }
  return in.sequence_parallel ? sbh * (34 / in.t + scores) : sbh * (10 + 24 / in.t + scores);
}

std::vector<KorthikantiRow> korthikanti_table(double s, double b, double h, double a, double t) {
  std::vector<KorthikantiRow> rows;
  KorthikantiInput in{s, b, h, a, 1, false, PaperRecompute::kNone};
  rows.push_back({"no parallelism", "sbh(34 + 5as/h)", korthikanti_layer_bytes(in)});
  in.t = t;
  rows.push_back({"tensor parallel", "sbh(10 + 24/t + 5as/(ht))", korthikanti_layer_bytes(in)});
  if (t > 1) {
    in.sequence_parallel = true;
    rows.push_back({"tensor + sequence parallel", "sbh(34/t + 5as/(ht))", korthikanti_layer_bytes(in)});
    in.sequence_parallel = false;
  }
  in.recompute = PaperRecompute::kSelective;
  rows.push_back({"tensor parallel + selective recompute", "sbh(10 + 24/t)", korthikanti_layer_bytes(in)});
  if (t > 1) {
    in.sequence_parallel = true;
    rows.push_back({"tensor + sequence parallel + selective recompute", "sbh(34/t)",
                    korthikanti_layer_bytes(in)});
    in.sequence_parallel = false;
  }
  in.recompute = PaperRecompute::kFull;
  rows.push_back({"full recompute", "2sbh", korthikanti_layer_bytes(in)});
  return rows;
}

KorthikantiView korthikanti_view(int64_t s, int64_t b, int64_t h, int64_t a, int64_t t,
                                 int64_t layers, int64_t pp) {
  KorthikantiView v{s, b, h, a, t, layers, pp, {}, 0, 0};
  v.rows = korthikanti_table(static_cast<double>(s), static_cast<double>(b),
                             static_cast<double>(h), static_cast<double>(a),
                             static_cast<double>(t));
  // Layers the first stage holds, times the micro-batches 1F1B keeps in flight there (pp).
  v.stage_layers = layers > 0 ? (layers + pp - 1) / pp : 0;
  v.layer_micro_batches = v.stage_layers * pp;
  return v;
}

}  // namespace ds::plan
