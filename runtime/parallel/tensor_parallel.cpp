// Megatron's named regions over a Comm (see tensor_parallel.h). Each region is one synchronous
// all-reduce: the model needs the result before its next kernel, so there is nothing to overlap
// at this granularity.
#include "parallel/tensor_parallel.h"

#include "common/error.h"

namespace ds::rt::parallel {

TensorParallelRegions::TensorParallelRegions(comm::CommPtr tp) : tp_(std::move(tp)) {
  if (!tp_) throw invalid_argument("TensorParallelRegions: the tp group's Comm is null");
}

void TensorParallelRegions::reduce(float* buf, int64_t n, comm::ReduceOp op) {
  if (n < 0) throw invalid_argument("tensor-parallel region: negative count {}", n);
  if (tp_->size() == 1) return;
  tp_->all_reduce(buf, static_cast<size_t>(n), comm::DataType::kFloat32, op);
  bytes_ += n * static_cast<int64_t>(sizeof(float));
}

void TensorParallelRegions::reduce_from_tp_forward(float* buf, int64_t n) {
  ++forward_calls_;
  reduce(buf, n, comm::ReduceOp::kSum);
}
void TensorParallelRegions::copy_to_tp_backward(float* buf, int64_t n) {
  ++backward_calls_;
  reduce(buf, n, comm::ReduceOp::kSum);
}
void TensorParallelRegions::loss_max(float* buf, int64_t n) {
  ++loss_calls_;
  reduce(buf, n, comm::ReduceOp::kMax);
}
void TensorParallelRegions::loss_sum(float* buf, int64_t n) {
  ++loss_calls_;
  reduce(buf, n, comm::ReduceOp::kSum);
}

TensorParallelHooks::TensorParallelHooks(comm::CommPtr tp, ParallelHooks* inner)
    : regions_(std::move(tp)), inner_(inner) {}

const float* TensorParallelHooks::params_needed(Unit unit, const float* resident) {
  return inner_ ? inner_->params_needed(unit, resident) : resident;
}
void TensorParallelHooks::params_done(Unit unit) {
  if (inner_) inner_->params_done(unit);
}
float* TensorParallelHooks::grads_needed(Unit unit, float* resident) {
  return inner_ ? inner_->grads_needed(unit, resident) : resident;
}
void TensorParallelHooks::grads_ready(Unit unit) {
  if (inner_) inner_->grads_ready(unit);
}
void TensorParallelHooks::tp_reduce_forward(float* buf, int64_t n) {
  regions_.reduce_from_tp_forward(buf, n);
}
void TensorParallelHooks::tp_reduce_backward(float* buf, int64_t n) {
  regions_.copy_to_tp_backward(buf, n);
}
void TensorParallelHooks::tp_loss_reduce_max(float* buf, int64_t n) {
  regions_.loss_max(buf, n);
}
void TensorParallelHooks::tp_loss_reduce_sum(float* buf, int64_t n) {
  regions_.loss_sum(buf, n);
}

}  // namespace ds::rt::parallel
