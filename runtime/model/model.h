// The interface the engines drive, whatever the model family: one part of a model (a pipeline
// stage's layers, a tensor-parallel shard) with its flat parameters and gradients, run in pieces.
// The one decoder (decoder.h) implements it for every family; the trainer, the pipeline stage, ZeRO
// and the checkpoints see only this. The contract of every piece is the one decoder.h states (loss
// and gradients, accumulation, recompute, storage types, devices, hooks).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/allocator.h"
#include "core/typed_ptr.h"
#include "model/hooks.h"
#include "layout/context_parallel.h"
#include "model_spec/shape.h"

namespace ds::rt {

struct ModelOptions {
  int B = 1;                 // micro-batch size
  int T = 1;                 // this rank's tokens of each sequence (the whole sequence / cp), T x cp <= seq_len
  bool recompute = false;    // activation checkpointing of every layer
  int head_chunk_rows = 0;   // rows of logits at once; 0: model_spec::head_chunk_rows_default
  bool own_params = true;    // allocate the flat parameter buffer (false: hooks serve parameters)
  bool own_grads = true;     // allocate the flat gradient buffer (false: hooks serve them)
  // Where the model's buffers live and its kernels run. Device::kCuda (builds with CUDA): every
  // buffer is device memory of the current device, kernels run on `cuda_stream` (a cudaStream_t;
  // nullptr = the legacy default stream) through kern::DeviceScope; params()/grads()/param()/
  // grad() and the activations are then DEVICE pointers. Token ids are still passed as HOST
  // pointers (validated on the host, uploaded into a small device buffer, tag workspace, 2*B*T
  // int32). The mean loss returned by head_* is copied back (synchronising the stream).
  // With kCuda the hooks are handed device pointers and must work on the device (the runtime's
  // do when built for it: ZeroEngine / TiedEmbeddingHooks with the same device and stream, and
  // tensor-parallel regions over an NCCL Comm). Every family runs on either device.
  Device device = Device::kCpu;
  void* cuda_stream = nullptr;
  // Storage types: parameters and activations (dtype), parameter gradients (grad_dtype: dtype or
  // fp32). Supported on the CPU: fp32/fp32, bf16/bf16, bf16/fp32, fp16/fp16, fp16/fp32; inside a CUDA
  // scope what the dispatch has (kernels/dispatch.h; the trainer keeps fp32).
  DType dtype = DType::kF32;
  DType grad_dtype = DType::kF32;
  // Context parallelism: each sequence of cp x T tokens is split over cp ranks, this one holding
  // the positions layout::cp_position_runs gives cp_rank under cp_method (positions, RoPE and
  // wpe follow the global index); attention goes to ParallelHooks::cp_attention_*.
  int cp = 1;
  int cp_rank = 0;
  layout::CpMethod cp_method = layout::CpMethod::kRing;
  // Megatron's sequence parallelism (part.tp > 1, B*T divisible by tp): the residual stream (the
  // embedding's output, each layer's res2 and out, the norms and their outputs, d_stream()) holds
  // this tp rank's B*T/tp rows, contiguous in the flattened (B,T) order; the tp hooks all-gather
  // before column-parallel matmuls and reduce-scatter after row-parallel ones (hooks.h).
  bool sequence_parallel = false;
  // Document-aware packing (data.packing "document", docs/data.md): the token that begins each
  // document (>= 0), or -1 for none (attention over the whole window, positions 0..T-1). With it,
  // row t belongs to the document starting at the last document token at or before t (index 0
  // when there is none); attention sees only its document's keys and positions (RoPE, wpe) count
  // from the document's start. Not with context parallelism (cp > 1).
  int document_token = -1;
};

// A mixture of experts' load-balancing statistics of one micro-batch (Hugging Face's
// load_balancing_loss_func over every layer's router): per expert the routed slots (top-k picks)
// and the sum of its router probabilities, over `rows` router rows (tokens x layers). Empty for a
// dense model. The loss is E * sum_e (counts_e / rows) * (prob_sums_e / rows).
struct RouterStats {
  std::vector<double> counts, prob_sums;
  double rows = 0;
  void reset(int experts) {
    counts.assign(static_cast<size_t>(experts), 0.0);
    prob_sums.assign(static_cast<size_t>(experts), 0.0);
    rows = 0;
  }
  double load_balancing_loss() const;  // 0 when empty
};

// One in-flight micro-batch's activations (tag activations), opaque to the engines but for the
// stage input and the losses. Movable; made by Model::new_activations.
class Activations {
 public:
  Activations() = default;
  virtual ~Activations() = default;
  Activations(Activations&&) = default;
  Activations& operator=(Activations&&) = default;

  TypedPtr input;          // (B,T,C): encoder output or the previous stage's output
  float* losses = nullptr;  // (B,T): per-token loss of the last head call
  // Mixture of experts: the statistics of the layers run forward so far (reset by embed_forward;
  // a pipeline stage receives its predecessors' with the input), and the grad_scale of the
  // micro-batch's backward (set by head_forward_backward; a pipeline stage receives it with the
  // stream's gradient), which the load-balancing loss's gradient needs in every layer.
  RouterStats router;
  float grad_scale = 1.0f;
  // A pipeline part of a mixture of experts: where the stage passes the statistics on (in the
  // model's device memory, tag activations; null otherwise). Two halves of router_wire_floats/2:
  // [0] what goes forward with the activations (the layers so far), [1] what goes backward with
  // the stream's gradient (every layer's, and grad_scale). Model::pack_router / unpack_router.
  float* router_wire = nullptr;
  // Document-aware packing (ModelOptions::document_token): each row's document start (B,T) int32
  // in the model's memory, set by Model::find_documents; null without packing.
  int32_t* doc_start = nullptr;
  // Evaluation (runtime/train/task_eval.h): set record_top before a forward-only head to have it
  // also keep, on the host, the per-token losses (host_losses, B*T) and per target whether it is
  // the model's most likely token among the vocabulary's first vocab_size (target_is_top, B*T: 1
  // or 0; an ignored target 1; a tie with another token counts as the top). Costs a host pass
  // over the logits (a copy per row on a GPU): evaluation only.
  bool record_top = false;
  std::vector<float> host_losses;
  std::vector<uint8_t> target_is_top;
  const Buffer& buffer() const { return buf_; }

 protected:
  Buffer buf_;
};

class Model {
 public:
  virtual ~Model() = default;

  virtual const model_spec::ModelShape& shape() const = 0;
  virtual const model_spec::ModelPart& part() const = 0;
  virtual const ModelOptions& options() const = 0;
  virtual const model_spec::ParamLayout& layout() const = 0;
  int64_t num_params() const { return layout().total; }
  DType dtype() const { return options().dtype; }
  DType grad_dtype() const { return options().grad_dtype; }
  virtual TypedPtr params() = 0;  // null without own_params
  virtual TypedPtr grads() = 0;   // null without own_grads
  // One tensor in the flat buffers (layer -1 for global tensors); invalid_argument when absent.
  virtual TypedPtr param(model_spec::ParamId id, int layer = -1) = 0;
  virtual TypedPtr grad(model_spec::ParamId id, int layer = -1) = 0;
  // Layout-independent initial weights (init.h): element values depend only on (seed, tensor,
  // layer, index in the full tensor).
  virtual void init_weights(uint64_t seed) = 0;
  virtual void zero_grads() = 0;
  // Training (the default) or evaluation: what differs is dropout (LoRA's), active in training only.
  virtual void set_training(bool on) {}

  virtual std::unique_ptr<Activations> new_activations() = 0;

  // ---- pieces (gpt2.h states their contract) ----
  // Document-aware packing: the micro-batch's document starts from its input tokens (B,T), host
  // pointer) into `a`. embed_forward calls it; a pipeline stage without the embedding calls it
  // before blocks_forward. Nothing to do without ModelOptions::document_token; with it, null
  // tokens are invalid_argument.
  virtual void find_documents(Activations& a, const int32_t* tokens) = 0;
  virtual void embed_forward(Activations& a, const int32_t* tokens) = 0;
  virtual void blocks_forward(Activations& a, int l0, int l1) = 0;
  virtual float head_forward(Activations& a, const int32_t* targets) = 0;
  virtual float head_forward_backward(Activations& a, const int32_t* targets, float grad_scale) = 0;
  // training.sync_loss_once: head_forward_backward with its loss left where it is. take_losses()
  // returns the mean loss of every such call since the last take, in order, each with the bits
  // head_forward_backward would have returned; on a GPU the sums stay on the device
  // (kern::loss_sum_to_slot) and come back in one copy, instead of one synchronisation per call.
  virtual void head_forward_backward_deferred(Activations& a, const int32_t* targets, float grad_scale) = 0;
  virtual std::vector<float> take_losses() = 0;
  // training.cuda_graph: a captured graph queued n deferred heads into the device's slots 0..n-1,
  // but nothing ran: drop_kept_losses() forgets them. After each replay, keep_replayed_losses(n)
  // makes take_losses() bring back those n slots (no losses may be pending then).
  virtual void drop_kept_losses() = 0;
  virtual void keep_replayed_losses(int n) = 0;
  virtual void blocks_backward(Activations& a, int l0, int l1) = 0;
  virtual void embed_backward(Activations& a, const int32_t* tokens) = 0;
  virtual TypedPtr d_stream() = 0;
  // Rows of the residual stream this part holds per micro-batch (d_stream(), output()): B*T, or
  // B*T/tp under sequence parallelism.
  int64_t stream_rows() const {
    const int64_t r = static_cast<int64_t>(options().B) * options().T;
    return options().sequence_parallel ? r / part().tp : r;
  }
  virtual TypedPtr output(Activations& a) = 0;

  // A pipeline stage's mixture of experts: the statistics (and, backward, grad_scale) into half
  // `half` of a.router_wire (0 forward, 1 backward) and back; router_wire_floats() its size, 0
  // where a.router_wire is null (a dense model, or a whole model).
  int64_t router_wire_floats(const Activations& a) const;
  void pack_router(Activations& a, int half);
  void unpack_router(Activations& a, int half);

  // The whole part in one call (embedding, all layers, head).
  float forward(Activations& a, const int32_t* tokens, const int32_t* targets);
  float forward_backward(Activations& a, const int32_t* tokens, const int32_t* targets, float grad_scale);

  // Loss masks (SFT): the head's backward gives each counted target the gradient of
  // grad_scale * loss / d instead of grad_scale * loss / (B*T) (0, the default: B*T). The trainer
  // sets d = (counted targets in the optimizer step) / (micro-batches x cp ranks in it), so the
  // step's gradient is that of the mean over its counted tokens (docs/training.md).
  void set_loss_divisor(double d) { loss_divisor_ = d; }

 protected:
  double loss_divisor_ = 0;
};

// Builds the one decoder (decoder.h) for shape.family.
std::unique_ptr<Model> make_model(const model_spec::ModelShape& shape, const model_spec::ModelPart& part,
                                  const ModelOptions& options, Allocator& alloc, ParallelHooks* hooks = nullptr);

}  // namespace ds::rt
