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

void TensorParallelRegions::all_gather(TypedPtr full, TypedPtr local, int64_t n) {
  ++forward_calls_;
  tp_->all_gather(local.data, full.data, static_cast<size_t>(n), comm_dtype(local.dtype));
  bytes_ += static_cast<int64_t>(local.bytes(n)) * tp_->size();
}
void TensorParallelRegions::reduce_scatter(TypedPtr local, TypedPtr full, int64_t n) {
  ++backward_calls_;
  tp_->reduce_scatter(full.data, local.data, static_cast<size_t>(n), comm_dtype(full.dtype), comm::ReduceOp::kSum);
  bytes_ += static_cast<int64_t>(full.bytes(n)) * tp_->size();
}
void TensorParallelRegions::sum(TypedPtr buf, int64_t n) { reduce(buf, n, comm::ReduceOp::kSum); }

TensorParallelHooks::TensorParallelHooks(comm::CommPtr tp, ParallelHooks* inner)
    : ForwardingHooks(inner), regions_(std::move(tp)) {}

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
void TensorParallelHooks::tp_all_gather(TypedPtr full, TypedPtr local, int64_t n) { regions_.all_gather(full, local, n); }
void TensorParallelHooks::tp_reduce_scatter(TypedPtr local, TypedPtr full, int64_t n) {
  regions_.reduce_scatter(local, full, n);
}
void TensorParallelHooks::tp_sum_partial_grads(TypedPtr buf, int64_t n) {
  if (grads_final_this_micro_batch()) regions_.sum(buf, n);
}

}  // namespace ds::rt::parallel
