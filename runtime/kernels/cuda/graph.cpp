// Streams and CUDA graphs (kernels/cuda/graph.h).
#include "kernels/cuda/graph.h"

#include <cuda_runtime_api.h>

#include <cstdio>

#include "kernels/cuda/check.h"

namespace ds::rt::cuda {

void* stream_create() {
  cudaStream_t s = nullptr;
  DS_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamDefault));
  return s;
}

void stream_destroy(void* stream) noexcept {
  if (stream == nullptr) return;
  const cudaError_t e = cudaStreamDestroy(static_cast<cudaStream_t>(stream));
  if (e != cudaSuccess) std::fprintf(stderr, "dstrain: cudaStreamDestroy: %s\n", cudaGetErrorString(e));
}

void graph_begin_capture(void* stream) {
  DS_CUDA_CHECK(cudaStreamBeginCapture(static_cast<cudaStream_t>(stream), cudaStreamCaptureModeThreadLocal));
}

void* graph_end_capture(void* stream, size_t* nodes) {
  cudaGraph_t g = nullptr;
  DS_CUDA_CHECK(cudaStreamEndCapture(static_cast<cudaStream_t>(stream), &g));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, g, 0);
  size_t n = 0;
  if (inst == cudaSuccess) cudaGraphGetNodes(g, nullptr, &n);
  cudaGraphDestroy(g);
  DS_CUDA_CHECK(inst);
  if (nodes != nullptr) *nodes = n;
  return exec;
}

void graph_abort_capture(void* stream) noexcept {
  cudaGraph_t g = nullptr;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status) != cudaSuccess ||
      status == cudaStreamCaptureStatusNone) {
    cudaGetLastError();
    return;
  }
  cudaStreamEndCapture(static_cast<cudaStream_t>(stream), &g);  // invalidated or not: dropped
  if (g != nullptr) cudaGraphDestroy(g);
  cudaGetLastError();  // the capture's error is the exception already in flight
}

void graph_launch(void* graph, void* stream) {
  DS_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), static_cast<cudaStream_t>(stream)));
}

void graph_destroy(void* graph) noexcept {
  if (graph == nullptr) return;
  const cudaError_t e = cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph));
  if (e != cudaSuccess) std::fprintf(stderr, "dstrain: cudaGraphExecDestroy: %s\n", cudaGetErrorString(e));
}

}  // namespace ds::rt::cuda
