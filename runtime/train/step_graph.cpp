// training.cuda_graph (step_graph.h).
#include "train/step_graph.h"

#include <fmt/format.h>

#include "common/error.h"
#include "core/cuda_memory_table.h"

namespace ds::rt::train {

namespace {
const CudaMemoryTable& cu() { return cuda_memory("training.cuda_graph"); }
}  // namespace

StepGraph::StepGraph() : stream_(cu().stream_create()) {}

StepGraph::~StepGraph() {
  cu().graph_destroy(exec_);
  cu().stream_destroy(stream_);
}

void StepGraph::capture(float loss_scale, const std::function<void()>& record) {
  cu().graph_destroy(exec_);
  exec_ = nullptr;
  cu().graph_begin_capture(stream_);
  try {
    record();
    exec_ = cu().graph_end_capture(stream_, &nodes_);
  } catch (const Error& e) {
    // A call the capture cannot hold (one that synchronises or allocates), named by CUDA's error.
    cu().graph_abort_capture(stream_);
    throw Error(e.kind(), fmt::format("training.cuda_graph: capturing the step as a CUDA graph failed: {}", e.what()),
                e.hint().empty() ? "train with training.cuda_graph false (and report the call named above)" : e.hint());
  } catch (...) {
    cu().graph_abort_capture(stream_);
    throw;
  }
  scale_ = loss_scale;
  captures_++;
}

void StepGraph::replay() { cu().graph_launch(exec_, stream_); }

}  // namespace ds::rt::train
