// training.cuda_graph: the forward and backward of a step's micro-batches, captured once as a
// CUDA graph and replayed each step, so the host launches one graph instead of every kernel of
// every micro-batch (docs/gpu.md, "What a step costs beyond the kernels").
//
// The model and its ZeRO engine run on the stream this class owns (EngineSpec's cuda_stream), a
// stream ordered with the legacy default stream, so the optimizer, the gradient norm and the
// checkpoints, which stay on the legacy stream outside the graph, need no events.
//
// What a replay repeats is its capture: every kernel's arguments and buffers. The trainer keeps
// everything a step changes outside it or in buffers the graph reads: the token ids in pinned
// host buffers (one slot per micro-batch, filled before each replay; the graph's copy nodes read
// them), the losses in the device's slots (Model::keep_replayed_losses). The loss scale is an
// argument of the head's kernels: a step with another scale (fp16's dynamic scaling) captures
// again. What cannot be kept out is refused by config::detail::check_cuda_graph and the trainer.
#pragma once

#include <cstddef>
#include <functional>

namespace ds::rt::train {

class StepGraph {
 public:
  StepGraph();  // creates the stream (the CUDA module loaded, the rank's device current)
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  void* stream() const { return stream_; }
  // Whether a graph is held, captured with this loss scale.
  bool captured_for(float loss_scale) const { return exec_ != nullptr && loss_scale == scale_; }
  // Captures what `record` queues on stream() (replacing any graph held). `record` must queue
  // work on stream() only and never synchronise. On an exception the capture is ended and nothing
  // is held; a ds::Error goes on with "training.cuda_graph: capturing ... failed" before its
  // message, any other exception as it is.
  void capture(float loss_scale, const std::function<void()>& record);
  // One replay, in the stream's order (asynchronous).
  void replay();
  size_t nodes() const { return nodes_; }
  int captures() const { return captures_; }

 private:
  void* stream_ = nullptr;
  void* exec_ = nullptr;
  float scale_ = 0;
  size_t nodes_ = 0;
  int captures_ = 0;
};

}  // namespace ds::rt::train
