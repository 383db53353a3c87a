// The family-independent parts of the Model interface: the whole-part passes and the factory.
#include "model/model.h"

#include "common/error.h"
#include "model/decoder.h"

namespace ds::rt {

double RouterStats::load_balancing_loss() const {
  if (rows <= 0 || counts.empty()) return 0.0;
  double sum = 0.0;
  for (size_t e = 0; e < counts.size(); e++) sum += counts[e] / rows * (prob_sums[e] / rows);
  return static_cast<double>(counts.size()) * sum;
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
