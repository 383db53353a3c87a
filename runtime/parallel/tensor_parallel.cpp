// Megatron's named regions over a Comm (see tensor_parallel.h). Each region is one synchronous
// all-reduce: the model needs the result before its next kernel, so there is nothing to overlap
// at this granularity.
#include "parallel/tensor_parallel.h"

#include "common/error.h"
#include "parallel/typed_comm.h"

namespace ds::rt::parallel {

TensorParallelRegions::TensorParallelRegions(comm::CommPtr tp) : tp_(std::move(tp)) {
  if (!tp_) throw invalid_argument("TensorParallelRegions: the tp group's Comm is null");
}

void TensorParallelRegions::reduce(TypedPtr buf, int64_t n, comm::ReduceOp op) {
  if (n < 0) throw invalid_argument("tensor-parallel region: negative count {}", n);
  if (tp_->size() == 1) return;
  tp_->all_reduce(buf.data, static_cast<size_t>(n), comm_dtype(buf.dtype), op);
  bytes_ += static_cast<int64_t>(buf.bytes(n));
}

void TensorParallelRegions::reduce_from_tp_forward(TypedPtr buf, int64_t n) {
  ++forward_calls_;
  reduce(buf, n, comm::ReduceOp::kSum);
}
void TensorParallelRegions::copy_to_tp_backward(TypedPtr buf, int64_t n) {
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

TypedPtr TensorParallelHooks::params_needed(Unit unit, TypedPtr resident) {
  return inner_ ? inner_->params_needed(unit, resident) : resident;
}
void TensorParallelHooks::params_done(Unit unit) {
  if (inner_) inner_->params_done(unit);
}
TypedPtr TensorParallelHooks::grads_needed(Unit unit, TypedPtr resident) {
  return inner_ ? inner_->grads_needed(unit, resident) : resident;
}
void TensorParallelHooks::grads_ready(Unit unit) {
  if (inner_) inner_->grads_ready(unit);
}
void TensorParallelHooks::tp_reduce_forward(TypedPtr buf, int64_t n) {
  regions_.reduce_from_tp_forward(buf, n);
}
void TensorParallelHooks::tp_reduce_backward(TypedPtr buf, int64_t n) {
  regions_.copy_to_tp_backward(buf, n);
}
void TensorParallelHooks::tp_loss_reduce_max(float* buf, int64_t n) {
  regions_.loss_max(buf, n);
}
void TensorParallelHooks::tp_loss_reduce_sum(float* buf, int64_t n) {
  regions_.loss_sum(buf, n);
}

}  // namespace ds::rt::parallel
