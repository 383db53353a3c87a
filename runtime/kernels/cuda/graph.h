// Streams and CUDA graphs for host code that must not include CUDA headers (training.cuda_graph:
// runtime/train/step_graph.h). Host-only header; the functions exist only inside the CUDA module
// (core/cuda_module.h) and are reached through core/cuda_memory_table.h. Handles are
// cudaStream_t and cudaGraphExec_t passed as void*.
//
// Contract:
// - stream_create: a new stream on the current device with default flags, so it stays ordered
//   with the legacy default stream (work queued there before waits for it, and the reverse) and
//   code that runs on the legacy stream (the optimizer, checkpoints) needs no events.
// - graph_begin_capture: starts capturing `stream` (cudaStreamCaptureModeThreadLocal: this
//   thread's calls that could synchronise fail instead). graph_end_capture ends it and returns the
//   instantiated graph (its node count in *nodes); when the capture failed (a kernel launch
//   error, a synchronising call inside it) it throws through DS_CUDA_CHECK, the stream usable
//   again. graph_abort_capture ends a capture that the caller's code left with an exception,
//   dropping what it held; it never throws.
// - graph_launch: one replay on `stream`, in stream order.
// - stream_destroy / graph_destroy never throw (errors are logged to stderr); null is ignored.
#pragma once

#include <cstddef>

namespace ds::rt::cuda {

void* stream_create();
void stream_destroy(void* stream) noexcept;
void graph_begin_capture(void* stream);
void* graph_end_capture(void* stream, size_t* nodes);
void graph_abort_capture(void* stream) noexcept;
void graph_launch(void* graph, void* stream);
void graph_destroy(void* graph) noexcept;

}  // namespace ds::rt::cuda
