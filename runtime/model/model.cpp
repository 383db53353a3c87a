// The family-independent parts of the Model interface: the whole-part passes and the factory.
#include "model/model.h"

#include <algorithm>

#include "common/error.h"
#include "kernels/dispatch.h"
#include "model/decoder.h"

namespace ds::rt {

double RouterStats::load_balancing_loss() const {
  if (rows <= 0 || counts.empty()) return 0.0;
  double sum = 0.0;
  for (size_t e = 0; e < counts.size(); e++) sum += counts[e] / rows * (prob_sums[e] / rows);
  return static_cast<double>(counts.size()) * sum;
}

// One half of the wire: the E counts, the E probability sums, the rows and grad_scale, as doubles.
int64_t Model::router_wire_floats(const Activations& a) const {
  return a.router_wire == nullptr ? 0 : 2 * 2 * (2 * static_cast<int64_t>(a.router.counts.size()) + 2);
}

void Model::pack_router(Activations& a, int half) {
  const int64_t n = router_wire_floats(a);
  if (n == 0) return;
  std::vector<double> v(a.router.counts);
  v.insert(v.end(), a.router.prob_sums.begin(), a.router.prob_sums.end());
  v.push_back(a.router.rows);
  v.push_back(a.grad_scale);
  kern::DeviceScope scope(options().device, options().cuda_stream);
  kern::copy_from_host(a.router_wire + half * n / 2, v.data(), v.size() * sizeof(double));
}

void Model::unpack_router(Activations& a, int half) {
  const int64_t n = router_wire_floats(a);
  if (n == 0) return;
  const size_t E = a.router.counts.size();
  std::vector<double> v(2 * E + 2);
  kern::DeviceScope scope(options().device, options().cuda_stream);
  kern::copy_to_host(v.data(), a.router_wire + half * n / 2, v.size() * sizeof(double));
  std::copy_n(v.begin(), E, a.router.counts.begin());
  std::copy_n(v.begin() + static_cast<int64_t>(E), E, a.router.prob_sums.begin());
  a.router.rows = v[2 * E];
  if (half == 1) a.grad_scale = static_cast<float>(v[2 * E + 1]);
}

float Model::forward(Activations& a, const int32_t* tokens, const int32_t* targets) {
  if (!part().has_embedding || !part().has_head) {
    throw invalid_usage("forward() runs a whole model; a pipeline stage runs the pieces");
  }
  embed_forward(a, tokens);
  blocks_forward(a, part().layer_begin, part().layer_end);
  return head_forward(a, targets);
}

float Model::forward_backward(Activations& a, const int32_t* tokens, const int32_t* targets, float grad_scale) {
  if (!part().has_embedding || !part().has_head) {
    throw invalid_usage("forward_backward() runs a whole model; a pipeline stage runs the pieces");
  }
  embed_forward(a, tokens);
  blocks_forward(a, part().layer_begin, part().layer_end);
  const float loss = head_forward_backward(a, targets, grad_scale);
  blocks_backward(a, part().layer_begin, part().layer_end);
  embed_backward(a, tokens);
  return loss;
}

std::unique_ptr<Model> make_model(const model_spec::ModelShape& shape, const model_spec::ModelPart& part,
                                  const ModelOptions& options, Allocator& alloc, ParallelHooks* hooks) {
  return std::make_unique<Decoder>(shape, part, options, alloc, hooks);
}

}  // namespace ds::rt
