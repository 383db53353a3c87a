// GPT-2 forward/backward over flat buffers. See gpt2.h for the contract; the per-layer math is
// llm.c's, with three differences that keep memory down:
// - attention keeps only its output and per-row log-sum-exp (backward recomputes the scores);
// - the attention and MLP projections write straight into the residual buffers (res2, out), so
//   their pre-residual outputs are never stored;
// - the head computes logits a chunk of rows at a time and, when training, runs the loss's
//   backward on each chunk at once, so (B*T, Vp) logits never exist.
#include "model/gpt2.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "common/check.h"
#include "common/error.h"
#include "common/progress.h"
#include "kernels/dispatch.h"
#include "kernels/typed.h"

namespace ds::rt {

namespace ms = model_spec;
namespace tk = kern::typed;  // the model's kernels take TypedPtr buffers
using ms::ParamId;
using ms::UnitKind;

namespace {
ParallelHooks& default_hooks() {
  static ParallelHooks h;
  return h;
}

// The view of one layer's buffer `name`: a storage-typed one or an fp32 statistic.
void layer_slot(LayerActs& r, const std::string& name, TypedPtr** typed, float*** stat) {
  if (name == "ln1") *typed = &r.ln1;
  else if (name == "ln1_mean") *stat = &r.ln1_mean;
  else if (name == "ln1_rstd") *stat = &r.ln1_rstd;
  else if (name == "qkv") *typed = &r.qkv;
  else if (name == "atty") *typed = &r.atty;
  else if (name == "att_lse") *stat = &r.att_lse;
  else if (name == "res2") *typed = &r.res2;
  else if (name == "ln2") *typed = &r.ln2;
  else if (name == "ln2_mean") *stat = &r.ln2_mean;
  else if (name == "ln2_rstd") *stat = &r.ln2_rstd;
  else if (name == "fch") *typed = &r.fch;
  else if (name == "fch_gelu") *typed = &r.fch_gelu;
  else if (name == "out") *typed = &r.out;
  else DS_CHECK(false, "unknown per-layer activation buffer {}", name);
}
}  // namespace

Gpt2::Gpt2(const ms::Gpt2Shape& shape, const ms::ModelPart& part, const Gpt2Options& options,
           Allocator& alloc, ParallelHooks* hooks)
    : shape_(shape), part_(part), opt_(options), alloc_(alloc),
      hooks_(hooks != nullptr ? hooks : &default_hooks()) {
  shape_.validate();
  part_.validate(shape_);
  if (opt_.B <= 0 || opt_.T <= 0 || opt_.T > shape_.seq_len) {
    throw invalid_argument("micro-batch shape B={} T={} is invalid: need B > 0 and 0 < T <= "
                           "model.seq_len ({})",
                           opt_.B, opt_.T, shape_.seq_len);
  }
  C_ = shape_.n_embd;
  Cl_ = C_ / part_.tp;
  NHl_ = shape_.n_head / part_.tp;
  Vp_l_ = shape_.padded_vocab_size / part_.tp;
  layout_ = ms::param_layout(shape_, part_);
  if (opt_.device == Device::kCudaHost) {
    throw invalid_argument("Gpt2Options::device: pinned host memory (kCudaHost) is for offload "
                           "buffers; the model runs on kCpu or kCuda");
  }
  const bool fp32_grads = opt_.grad_dtype == DType::kF32;
  if (opt_.grad_dtype != opt_.dtype && !fp32_grads) {
    throw invalid_argument("Gpt2Options: gradients of type {} for {} storage: gradients are stored in the storage "
                           "type or in fp32",
                           dtype_name(opt_.grad_dtype), dtype_name(opt_.dtype));
  }
  const Device dev = opt_.device;
  const size_t n = static_cast<size_t>(layout_.total);
  if (opt_.own_params) params_ = alloc_.allocate(n * dtype_size(opt_.dtype), MemTag::kParams, "gpt2 parameters", dev);
  if (opt_.own_grads) {
    grads_ = alloc_.allocate(n * dtype_size(opt_.grad_dtype), MemTag::kGrads, "gpt2 gradients", dev);
  }
  if (dev == Device::kCuda) {
    dev_ids_ = alloc_.allocate(2 * static_cast<size_t>(opt_.B) * opt_.T * sizeof(int32_t),
                               MemTag::kWorkspace, "gpt2 device token ids", dev);
  }

  threads_ = omp_get_max_threads();
  // The CUDA attention needs no scratch (tk::attention_scratch_floats is 0 there).
  ms::ActConfig cfg{opt_.B, opt_.T, opt_.recompute, dev == Device::kCuda ? 0 : threads_,
                    opt_.head_chunk_rows, static_cast<int>(dtype_size(opt_.dtype))};
  head_rows_ = cfg.head_chunk_rows > 0 ? cfg.head_chunk_rows
                                       : ms::head_chunk_rows_default(shape_, opt_.B, opt_.T, part_.tp);
  head_rows_ = std::min(head_rows_, opt_.B * opt_.T);
  cfg.head_chunk_rows = head_rows_;
  act_list_ = ms::gpt2_activations(shape_, part_, cfg);

  // Shared buffers: one allocation per tag, views by name.
  const int sb = static_cast<int>(dtype_size(opt_.dtype));
  int64_t act_bytes = 0, ws_bytes = 0;
  for (const auto& b : act_list_) {
    if (b.scope != ms::ActScope::kShared) continue;
    (b.tag == ms::ActTag::kActivations ? act_bytes : ws_bytes) += b.bytes(sb);
  }
  shared_act_ = alloc_.allocate(static_cast<size_t>(act_bytes), MemTag::kActivations, "gpt2 shared activations", dev);
  shared_ws_ = alloc_.allocate(static_cast<size_t>(ws_bytes), MemTag::kWorkspace, "gpt2 workspace", dev);
  char* pa = static_cast<char*>(shared_act_.data());
  char* pw = static_cast<char*>(shared_ws_.data());
  for (const auto& b : act_list_) {
    if (b.scope != ms::ActScope::kShared) continue;
    char*& cursor = b.tag == ms::ActTag::kActivations ? pa : pw;
    const std::string& nm = b.name;
    LayerActs& r = recompute_;
    TypedPtr* typed = nm == "dres" ? &dres_ : nm == "dln" ? &dln_ : nm == "dqkv" ? &dqkv_ : nm == "datty" ? &datty_
                    : nm == "dfch" ? &dfch_ : nm == "logits" ? &logits_ : nullptr;
    float** stat = nm == "att_scratch" ? &att_scratch_ : nm == "ce_stats" ? &ce_stats_ : nullptr;
    if (typed == nullptr && stat == nullptr) layer_slot(r, nm, &typed, &stat);
    place_buffer(b, cursor, typed, stat);
  }
}

void Gpt2::place_buffer(const ms::ActBuffer& b, char*& cursor, TypedPtr* typed, float** stat) const {
  DS_CHECK((typed != nullptr) != (stat != nullptr), "activation buffer {} has no view", b.name);
  DS_CHECK((stat != nullptr) == b.fp32, "activation buffer {}: statistic or storage type mixed up", b.name);
  if (typed != nullptr) *typed = TypedPtr(cursor, opt_.dtype);
  if (stat != nullptr) *stat = reinterpret_cast<float*>(cursor);
  cursor += b.bytes(static_cast<int>(dtype_size(opt_.dtype)));
}

Gpt2Activations Gpt2::make_activations() {
  Gpt2Activations a;
  const int nl = part_.layer_end - part_.layer_begin;
  const int sb = static_cast<int>(dtype_size(opt_.dtype));
  int64_t total = 0;
  for (const auto& b : act_list_) {
    if (b.scope == ms::ActScope::kPerLayer) total += b.bytes(sb) * nl;
    if (b.scope == ms::ActScope::kPerMicroBatch) total += b.bytes(sb);
  }
  a.buf_ = alloc_.allocate(static_cast<size_t>(total), MemTag::kActivations, "gpt2 micro-batch activations",
                           opt_.device);
  a.layers.assign(static_cast<size_t>(nl), recompute_);
  char* cursor = static_cast<char*>(a.buf_.data());
  for (const auto& b : act_list_) {
    if (b.scope == ms::ActScope::kShared) continue;
    const std::string& nm = b.name;
    if (b.scope == ms::ActScope::kPerMicroBatch) {
      TypedPtr* typed = nm == "input" ? &a.input : nm == "lnf" ? &a.lnf : nullptr;
      float** stat = nm == "lnf_mean" ? &a.lnf_mean : nm == "lnf_rstd" ? &a.lnf_rstd : nm == "losses" ? &a.losses : nullptr;
      DS_CHECK(typed != nullptr || stat != nullptr, "unknown activation buffer {}", nm);
      place_buffer(b, cursor, typed, stat);
      continue;
    }
    for (auto& la : a.layers) {
      TypedPtr* typed = nullptr;
      float** stat = nullptr;
      layer_slot(la, nm, &typed, &stat);
      place_buffer(b, cursor, typed, stat);
    }
  }
  DS_CHECK(cursor == static_cast<char*>(a.buf_.data()) + total);
  return a;
}

std::unique_ptr<Activations> Gpt2::new_activations() {
  return std::make_unique<Gpt2Activations>(make_activations());
}

Gpt2Activations& Gpt2::own(Activations& a) {
  auto* g = dynamic_cast<Gpt2Activations*>(&a);
  if (g == nullptr) throw invalid_usage("a GPT-2 model was handed another model's activations");
  return *g;
}

TypedPtr Gpt2::param(ParamId id, int layer) {
  const auto* t = layout_.find_tensor(id, layer);
  if (t == nullptr || params_.empty()) {
    throw invalid_argument("parameter {} (layer {}) is not held by this model part",
                           ms::find_param(ms::gpt2_params(shape_), id).name, layer);
  }
  return params() + t->offset;
}

TypedPtr Gpt2::grad(ParamId id, int layer) {
  const auto* t = layout_.find_tensor(id, layer);
  if (t == nullptr || grads_.empty()) {
    throw invalid_argument("gradient of {} (layer {}) is not held by this model part",
                           ms::find_param(ms::gpt2_params(shape_), id).name, layer);
  }
  return grads() + t->offset;
}

void Gpt2::zero_grads() {
  kern::DeviceScope scope(opt_.device, opt_.cuda_stream);
  if (!grads_.empty()) ::ds::rt::kern::fill_zero(grads_.data(), grads_.bytes());
}

const int32_t* Gpt2::ids_for_kernels(const int32_t* host, int slot) {
  if (opt_.device != Device::kCuda) return host;
  const size_t n = static_cast<size_t>(opt_.B) * opt_.T;
  int32_t* dst = dev_ids_.as<int32_t>() + static_cast<size_t>(slot) * n;
  kern::copy_from_host(dst, host, n * sizeof(int32_t));
  return dst;
}

LayerWeights Gpt2::layer_weights(TypedPtr base) const {
  auto at = [&](ParamId id) { return base + layout_.offset_in_unit(id); };
  return LayerWeights{at(ParamId::kLn1w),     at(ParamId::kLn1b),    at(ParamId::kQkvw),
                      at(ParamId::kQkvb),     at(ParamId::kAttprojw), at(ParamId::kAttprojb),
                      at(ParamId::kLn2w),     at(ParamId::kLn2b),    at(ParamId::kFcw),
                      at(ParamId::kFcb),      at(ParamId::kFcprojw), at(ParamId::kFcprojb)};
}

TypedPtr Gpt2::unit_params(Unit u) {
  const auto* s = layout_.find_unit(u.kind, u.layer);
  DS_CHECK(s != nullptr, "unit not in this part");
  const TypedPtr resident = params_.empty() ? TypedPtr() : params() + s->offset;
  const TypedPtr p = hooks_->params_needed(u, resident);
  if (!p) {
    throw invalid_usage("no parameters for a model unit (layer {}): the model was built without "
                        "its own parameters and the parallel hooks returned none",
                        u.layer);
  }
  return p;
}

TypedPtr Gpt2::unit_grads(Unit u) {
  const auto* s = layout_.find_unit(u.kind, u.layer);
  DS_CHECK(s != nullptr, "unit not in this part");
  const TypedPtr resident = grads_.empty() ? TypedPtr() : grads() + s->offset;
  const TypedPtr g = hooks_->grads_needed(u, resident);
  if (!g) {
    throw invalid_usage("no gradient buffer for a model unit (layer {}): the model was built "
                        "without its own gradients and the parallel hooks returned none",
                        u.layer);
  }
  return g;
}

void Gpt2::check_layers(int l0, int l1, const char* what) const {
  if (l0 < part_.layer_begin || l1 > part_.layer_end || l0 > l1) {
    throw invalid_argument("{}: layers [{}, {}) are not within this part's [{}, {})", what, l0, l1,
                           part_.layer_begin, part_.layer_end);
  }
  if (opt_.device != Device::kCuda && omp_get_max_threads() > threads_) {
    throw invalid_usage("{}: OpenMP now has {} threads but the model was built for {}: build the "
                        "model after setting the thread count",
                        what, omp_get_max_threads(), threads_);
  }
}

TypedPtr Gpt2::layer_input(Gpt2Activations& a, int l) {
  return l == part_.layer_begin ? a.input
                                : a.layers[static_cast<size_t>(l - 1 - part_.layer_begin)].out;
}

TypedPtr Gpt2::output(Gpt2Activations& a) {
  return a.layers.empty() ? a.input : a.layers.back().out;
}

// ---- embedding ---------------------------------------------------------------------------------

void Gpt2::embed_forward(Gpt2Activations& a, const int32_t* tokens) {
  if (!part_.has_embedding) throw invalid_usage("embed_forward on a part without the embedding");
  const int64_t BT = static_cast<int64_t>(opt_.B) * opt_.T;
  for (int64_t i = 0; i < BT; i++) {
    if (tokens[i] < 0 || tokens[i] >= shape_.vocab_size) {
      throw invalid_argument("input token {} at position {} (row {}, column {}) is outside the "
                             "vocabulary [0, {})",
                             tokens[i], i, i / opt_.T, i % opt_.T, shape_.vocab_size);
    }
  }
  kern::DeviceScope scope(opt_.device, opt_.cuda_stream);
  tokens = ids_for_kernels(tokens, 0);
  const Unit wte{UnitKind::kTokenEmbedding}, wpe{UnitKind::kPositionEmbedding};
  const TypedPtr pte = unit_params(wte);
  const TypedPtr ppe = unit_params(wpe);
  if (part_.tp == 1) {
    tk::encoder_forward(a.input, tokens, pte, ppe, opt_.B, opt_.T, C_);
  } else {
    // Vocabulary-parallel: each rank embeds the tokens of its rows, the group sums, then the
    // (replicated) position embedding is added once.
    tk::encoder_forward_vocab(a.input, tokens, pte, opt_.B, opt_.T, C_, part_.tp_rank * Vp_l_,
                                Vp_l_);
    hooks_->tp_reduce_forward(a.input, static_cast<int64_t>(opt_.B) * opt_.T * C_);
    tk::add_position(a.input, ppe, opt_.B, opt_.T, C_);
  }
  hooks_->params_done(wte);
  hooks_->params_done(wpe);
}

void Gpt2::embed_backward(Gpt2Activations& a, const int32_t* tokens) {
  if (!part_.has_embedding) throw invalid_usage("embed_backward on a part without the embedding");
  kern::DeviceScope scope(opt_.device, opt_.cuda_stream);
  tokens = ids_for_kernels(tokens, 0);
  const Unit wte{UnitKind::kTokenEmbedding}, wpe{UnitKind::kPositionEmbedding};
  if (part_.tp == 1) {
    tk::encoder_backward(unit_grads(wte), unit_grads(wpe), dres_, tokens, opt_.B, opt_.T, C_);
  } else {
    tk::encoder_backward_vocab(unit_grads(wte), dres_, tokens, opt_.B, opt_.T, C_,
                                 part_.tp_rank * Vp_l_, Vp_l_);
    tk::encoder_backward(TypedPtr(), unit_grads(wpe), dres_, tokens, opt_.B, opt_.T, C_);
  }
  hooks_->grads_ready(wpe);
  hooks_->grads_ready(wte);
}

// ---- transformer blocks ------------------------------------------------------------------------

void Gpt2::layer_forward(LayerActs& a, TypedPtr x, const LayerWeights& w, bool full) {
  const int B = opt_.B, T = opt_.T, C = C_;
  const int64_t BTC = static_cast<int64_t>(B) * T * C;
  tk::layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, w.ln1w, w.ln1b, B, T, C);
  tk::matmul_forward(a.qkv, a.ln1, w.qkvw, w.qkvb, B, T, C, 3 * Cl_);
  tk::attention_forward(a.atty, a.att_lse, a.qkv, att_scratch_, B, T, Cl_, NHl_);
  // Row-parallel projection straight into res2, reduced over tp, then bias and residual.
  tk::matmul_forward(a.res2, a.atty, w.attprojw, TypedPtr(), B, T, Cl_, C);
  hooks_->tp_reduce_forward(a.res2, BTC);
  tk::add_bias(a.res2, w.attprojb, B * T, C);
  tk::residual_forward(a.res2, a.res2, x, BTC);
  tk::layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, w.ln2w, w.ln2b, B, T, C);
  tk::matmul_forward(a.fch, a.ln2, w.fcw, w.fcb, B, T, C, 4 * Cl_);
  tk::gelu_forward(a.fch_gelu, a.fch, static_cast<int64_t>(B) * T * 4 * Cl_);
  if (!full) return;  // a recompute for backward needs nothing past here
  tk::matmul_forward(a.out, a.fch_gelu, w.fcprojw, TypedPtr(), B, T, 4 * Cl_, C);
  hooks_->tp_reduce_forward(a.out, BTC);
  tk::add_bias(a.out, w.fcprojb, B * T, C);
  tk::residual_forward(a.out, a.out, a.res2, BTC);
}

void Gpt2::blocks_forward(Gpt2Activations& a, int l0, int l1) {
  check_layers(l0, l1, "blocks_forward");
  kern::DeviceScope scope(opt_.device, opt_.cuda_stream);
  for (int l = l0; l < l1; l++) {
    const Unit u{UnitKind::kLayer, l};
    const LayerWeights w = layer_weights(unit_params(u));
    layer_forward(a.layers[static_cast<size_t>(l - part_.layer_begin)], layer_input(a, l), w, true);
    progress::bump();  // comm/beacon.h: a slow step is not a hang
    hooks_->params_done(u);
  }
}

void Gpt2::blocks_backward(Gpt2Activations& a, int l0, int l1) {
  check_layers(l0, l1, "blocks_backward");
  kern::DeviceScope scope(opt_.device, opt_.cuda_stream);
  const int B = opt_.B, T = opt_.T, C = C_;
  const int64_t BTC = static_cast<int64_t>(B) * T * C;
  for (int l = l1 - 1; l >= l0; l--) {
    const Unit u{UnitKind::kLayer, l};
    const LayerWeights w = layer_weights(unit_params(u));
    const LayerWeights g = layer_weights(unit_grads(u));
    LayerActs& la = a.layers[static_cast<size_t>(l - part_.layer_begin)];
    const TypedPtr x = layer_input(a, l);
    if (opt_.recompute) layer_forward(la, x, w, false);
    // dres holds d(out). MLP: out = res2 + fcproj(gelu(fc(ln2(res2)))).
    tk::matmul_backward(dfch_, g.fcprojw, g.fcprojb, dres_, la.fch_gelu, w.fcprojw, B, T,
                          4 * Cl_, C);
    tk::gelu_backward(dfch_, la.fch, dfch_, static_cast<int64_t>(B) * T * 4 * Cl_);
    tk::matmul_backward(dln_, g.fcw, g.fcb, dfch_, la.ln2, w.fcw, B, T, C, 4 * Cl_);
    hooks_->tp_reduce_backward(dln_, BTC);
    tk::layernorm_backward(dres_, g.ln2w, g.ln2b, dln_, la.res2, w.ln2w, la.ln2_mean,
                             la.ln2_rstd, B, T, C);
    // dres holds d(res2). Attention: res2 = x + attproj(attn(qkv(ln1(x)))).
    tk::matmul_backward(datty_, g.attprojw, g.attprojb, dres_, la.atty, w.attprojw, B, T, Cl_, C);
    tk::attention_backward(dqkv_, datty_, la.qkv, la.atty, la.att_lse, att_scratch_, B, T, Cl_,
                             NHl_);
    tk::matmul_backward(dln_, g.qkvw, g.qkvb, dqkv_, la.ln1, w.qkvw, B, T, C, 3 * Cl_);
    hooks_->tp_reduce_backward(dln_, BTC);
    tk::layernorm_backward(dres_, g.ln1w, g.ln1b, dln_, x, w.ln1w, la.ln1_mean, la.ln1_rstd, B,
                             T, C);
    // dres holds d(x).
    hooks_->params_done(u);
    hooks_->grads_ready(u);
    progress::bump();
  }
}

// ---- head: final LayerNorm, tied lm_head, loss --------------------------------------------------

float Gpt2::head(Gpt2Activations& a, const int32_t* targets, bool backward, float grad_scale) {
  if (!part_.has_head) throw invalid_usage("head on a part without the head");
  const int B = opt_.B, T = opt_.T, C = C_, BT = B * T;
  const int V = shape_.vocab_size, Vp = Vp_l_;
  const Unit wte{UnitKind::kTokenEmbedding}, lnf{UnitKind::kFinalNorm};
  const TypedPtr pte = unit_params(wte);
  const TypedPtr pf = unit_params(lnf);
  const TypedPtr lnfw = pf + layout_.offset_in_unit(ParamId::kLnfw);
  const TypedPtr lnfb = pf + layout_.offset_in_unit(ParamId::kLnfb);
  for (int i = 0; i < BT; i++) {
    if (targets[i] < 0 || targets[i] >= V) {
      throw invalid_argument("target token {} at position {} (row {}, column {}) is outside the "
                             "vocabulary [0, {})",
                             targets[i], i, i / T, i % T, V);
    }
  }
  kern::DeviceScope scope(opt_.device, opt_.cuda_stream);
  targets = ids_for_kernels(targets, 1);
  const TypedPtr x = output(a);
  tk::layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, x, lnfw, lnfb, B, T, C);
  const TypedPtr gte = backward ? unit_grads(wte) : TypedPtr();
  const float dloss = grad_scale / static_cast<float>(BT);
  int64_t bad = 0;
  for (int r0 = 0; r0 < BT; r0 += head_rows_) {
    const int rows = std::min(head_rows_, BT - r0);
    const TypedPtr xin = a.lnf + static_cast<int64_t>(r0) * C;
    tk::matmul_forward(logits_, xin, pte, TypedPtr(), 1, rows, C, Vp);
    if (part_.tp > 1) {
      // Vocabulary-parallel loss: global row max, then global sums, then losses and dlogits.
      const int v0 = part_.tp_rank * Vp_l_;
      float* mx = ce_stats_;
      float* sumexp = ce_stats_ + rows;
      float* tlogit = ce_stats_ + 2 * rows;
      tk::vocab_ce_max(mx, logits_, rows, Vp, v0, V);
      hooks_->tp_loss_reduce_max(mx, rows);
      tk::vocab_ce_sums(sumexp, tlogit, logits_, mx, targets + r0, rows, Vp, v0, V);
      hooks_->tp_loss_reduce_sum(ce_stats_ + rows, 2 * static_cast<int64_t>(rows));
      tk::vocab_ce_finish(a.losses + r0, backward ? logits_ : TypedPtr(), mx, sumexp, tlogit,
                            targets + r0, dloss, rows, Vp, v0, V);
      if (backward) {
        const TypedPtr dx = dln_ + static_cast<int64_t>(r0) * C;
        tk::matmul_backward(dx, gte, TypedPtr(), logits_, xin, pte, 1, rows, C, Vp);
        hooks_->tp_reduce_backward(dx, static_cast<int64_t>(rows) * C);
      }
    } else if (backward) {
      bad += tk::crossentropy_softmax_backward(a.losses + r0, logits_, targets + r0, dloss, rows,
                                                 V, Vp);
      tk::matmul_backward(dln_ + static_cast<int64_t>(r0) * C, gte, TypedPtr(), logits_, xin, pte, 1,
                            rows, C, Vp);
    } else {
      bad += tk::crossentropy_forward(a.losses + r0, logits_, targets + r0, rows, V, Vp);
    }
  }
  DS_CHECK(bad == 0, "targets were validated");
  if (backward) {
    const TypedPtr gf = unit_grads(lnf);
    tk::fill_zero(dres_, static_cast<int64_t>(BT) * C);
    tk::layernorm_backward(dres_, gf + layout_.offset_in_unit(ParamId::kLnfw),
                             gf + layout_.offset_in_unit(ParamId::kLnfb), dln_, x, lnfw,
                             a.lnf_mean, a.lnf_rstd, B, T, C);
    hooks_->grads_ready(lnf);
    if (!part_.has_embedding) hooks_->grads_ready(wte);
  }
  hooks_->params_done(wte);
  hooks_->params_done(lnf);
  const float* losses = a.losses;
  std::vector<float> host_losses;
  if (opt_.device == Device::kCuda) {
    host_losses.resize(static_cast<size_t>(BT));
    kern::copy_to_host(host_losses.data(), a.losses, host_losses.size() * sizeof(float));
    losses = host_losses.data();
  }
  double sum = 0.0;
  for (int i = 0; i < BT; i++) sum += losses[i];
  return static_cast<float>(sum / BT);
}

float Gpt2::head_forward(Gpt2Activations& a, const int32_t* targets) {
  return head(a, targets, false, 0.0f);
}

float Gpt2::head_forward_backward(Gpt2Activations& a, const int32_t* targets, float grad_scale) {
  return head(a, targets, true, grad_scale);
}

// ---- whole part ----------------------------------------------------------------------------------

float Gpt2::forward(Gpt2Activations& a, const int32_t* tokens, const int32_t* targets) {
  if (!part_.has_embedding || !part_.has_head) {
    throw invalid_usage("forward() runs a whole model; a pipeline stage runs the pieces");
  }
  embed_forward(a, tokens);
  blocks_forward(a, part_.layer_begin, part_.layer_end);
  return head_forward(a, targets);
}

float Gpt2::forward_backward(Gpt2Activations& a, const int32_t* tokens, const int32_t* targets,
                             float grad_scale) {
  if (!part_.has_embedding || !part_.has_head) {
    throw invalid_usage("forward_backward() runs a whole model; a pipeline stage runs the pieces");
  }
  embed_forward(a, tokens);
  blocks_forward(a, part_.layer_begin, part_.layer_end);
  const float loss = head_forward_backward(a, targets, grad_scale);
  blocks_backward(a, part_.layer_begin, part_.layer_end);
  embed_backward(a, tokens);
  return loss;
}

}  // namespace ds::rt
