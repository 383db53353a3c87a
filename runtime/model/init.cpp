// Weight initialisation from a counter-based generator: element i of tensor t (layer l) is
// a pure function of (seed, t, l, i), with i its index in the FULL tensor. Any shard (tensor-
// parallel rank, ZeRO partition, pipeline stage) generates its part alone and every layout starts
// from the same model.
#include <omp.h>

#include <cmath>
#include <vector>

#include "common/error.h"
#include "model/init.h"

namespace ds::rt {

namespace ms = model_spec;

namespace {
uint64_t mix64(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

namespace {
uint64_t init_hash(uint64_t seed, int tensor, int layer, int64_t index) {
  const uint64_t key = (static_cast<uint64_t>(tensor) << 56) ^
                       (static_cast<uint64_t>(layer + 1) << 40) ^ static_cast<uint64_t>(index);
  return mix64(key ^ mix64(seed));
}
}  // namespace

double init_uniform(uint64_t seed, int tensor, int layer, int64_t index) {
  return (static_cast<double>(init_hash(seed, tensor, layer, index) >> 11) + 0.5) * 0x1.0p-53;  // (0, 1)
}

double init_normal(uint64_t seed, int tensor, int layer, int64_t index) {
  const uint64_t h1 = init_hash(seed, tensor, layer, index);
  const uint64_t h2 = mix64(h1 ^ 0x5851f42d4c957f2dull);
  const double u1 = (static_cast<double>(h1 >> 11) + 0.5) * 0x1.0p-53;  // (0, 1)
  const double u2 = static_cast<double>(h2 >> 11) * 0x1.0p-53;          // [0, 1)
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

void init_tensor_values(float* dst, const ms::ParamTensor& t, int layer, int n_layer, int tp,
                        int tp_rank, uint64_t seed, int64_t local_begin, int64_t count, int ep, int ep_rank) {
  double std = 0.0;
  switch (t.init) {
    case ms::InitKind::kZeros: std = -1.0; break;
    case ms::InitKind::kOnes: std = -2.0; break;
    case ms::InitKind::kNormal: std = 0.02; break;
    case ms::InitKind::kNormalResidual: std = 0.02 / std::sqrt(2.0 * n_layer); break;
    case ms::InitKind::kKaimingUniform: std = -3.0; break;
  }
  // Kaiming-uniform (a LoRA A): U(-1/sqrt(in), 1/sqrt(in)), in = shape[1].
  const double bound = 1.0 / std::sqrt(static_cast<double>(t.shape.size() > 1 ? t.shape[1] : 1));
  const int id = static_cast<int>(t.id);
#pragma omp parallel for schedule(static) if (count >= 16384)
  for (int64_t i = 0; i < count; i++) {
    float v;
    if (std == -1.0) {
      v = 0.0f;
    } else if (std == -2.0) {
      v = 1.0f;
    } else if (std == -3.0) {
      const int64_t full = ms::full_index(t, tp, tp_rank, local_begin + i, ep, ep_rank);
      v = static_cast<float>(bound * (2.0 * init_uniform(seed, id, layer, full) - 1.0));
    } else {
      const int64_t full = ms::full_index(t, tp, tp_rank, local_begin + i, ep, ep_rank);
      v = static_cast<float>(std * init_normal(seed, id, layer, full));
    }
    dst[i] = v;
  }
}

}  // namespace ds::rt
