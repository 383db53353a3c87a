// FLOPs of a model (flops.h).
#include "model_spec/flops.h"

namespace ds::model_spec {

double model_flops_per_token(const ModelShape& s, int T) {
  const double attention = static_cast<double>(s.n_head) * s.head_dim();
  return 6.0 * static_cast<double>(active_param_count(s)) + 6.0 * s.n_layer * attention * T;
}

double layer_matmul_params(const ModelShape& s) {
  double n = 0;
  for (const auto& t : model_params(s)) {
    if (!t.per_layer || t.shape.size() != 2) continue;
    n += t.experts > 0 ? static_cast<double>(t.numel()) / t.experts * s.num_experts_per_tok
                  : static_cast<double>(t.numel());
  }
  return n;
}

double layer_forward_flops(const ModelShape& s, int T) {
  const double attention = static_cast<double>(s.n_head) * s.head_dim();
  return 2.0 * T * layer_matmul_params(s) + 4.0 * T * static_cast<double>(T) * attention;
}

double head_flops(const ModelShape& s, int T) {
  return 3.0 * 2 * T * s.n_embd * static_cast<double>(s.padded_vocab_size);
}

}  // namespace ds::model_spec
