// Llama forward/backward over flat buffers. See llama.h for the contract and the architecture.
// The structure is Gpt2's (gpt2.cpp): pieces calling kernels and the parallel hooks at the same
// named points, projections written straight into the residual buffers, the head computing
// logits a chunk of rows at a time (its loss backward fused), recompute re-running a layer's
// forward (same kernels, same order) before its backward.
#include "model/llama.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/error.h"
#include "common/progress.h"
#include "kernels/dispatch.h"
#include "kernels/llama_typed.h"
#include "kernels/typed.h"
#include "model/init.h"

namespace ds::rt {

namespace ms = model_spec;
namespace tk = kern::typed;
namespace lk = kern::llama;
using ms::ParamId;
using ms::UnitKind;

namespace {

ParallelHooks& default_hooks() {
  static ParallelHooks h;
  return h;
}

// The per-layer buffers by name: storage-typed views or fp32 statistics.
struct LayerSlot {
  const char* name;
  TypedPtr LlamaLayerActs::*typed;
  float* LlamaLayerActs::*stat;
};
constexpr LayerSlot kLayerSlots[] = {
    {"ln1", &LlamaLayerActs::ln1, nullptr},       {"ln1_rstd", nullptr, &LlamaLayerActs::ln1_rstd},
    {"qkv", &LlamaLayerActs::qkv, nullptr},       {"atty", &LlamaLayerActs::atty, nullptr},
    {"att_lse", nullptr, &LlamaLayerActs::att_lse}, {"res2", &LlamaLayerActs::res2, nullptr},
    {"ln2", &LlamaLayerActs::ln2, nullptr},       {"ln2_rstd", nullptr, &LlamaLayerActs::ln2_rstd},
    {"gu", &LlamaLayerActs::gu, nullptr},         {"act", &LlamaLayerActs::act, nullptr},
    {"out", &LlamaLayerActs::out, nullptr},
};

const LayerSlot* layer_slot(const std::string& name) {
  for (const auto& s : kLayerSlots) {
    if (name == s.name) return &s;
  }
  return nullptr;
}

}  // namespace

Llama::Llama(const ms::ModelShape& shape, const ms::ModelPart& part, const ModelOptions& options, Allocator& alloc,
             ParallelHooks* hooks)
    : shape_(shape), part_(part), opt_(options), alloc_(alloc), hooks_(hooks != nullptr ? hooks : &default_hooks()) {
  if (!shape_.llama()) throw invalid_usage("a Llama model built from a {} shape", ms::model_family_name(shape_.family));
  shape_.validate();
  part_.validate(shape_);
  if (opt_.B <= 0 || opt_.T <= 0 || opt_.T > shape_.seq_len) {
    throw invalid_argument("micro-batch shape B={} T={} is invalid: need B > 0 and 0 < T <= model.seq_len ({})",
                           opt_.B, opt_.T, shape_.seq_len);
  }
  if (opt_.device == Device::kCudaHost) {
    throw invalid_argument("ModelOptions::device: pinned host memory (kCudaHost) is for offload buffers; a Llama "
                           "runs on kCpu or kCuda");
  }
  if (opt_.grad_dtype != opt_.dtype && opt_.grad_dtype != DType::kF32) {
    throw invalid_argument("ModelOptions: gradients of type {} for {} storage: gradients are stored in the storage "
                           "type or in fp32",
                           dtype_name(opt_.grad_dtype), dtype_name(opt_.dtype));
  }
  C_ = shape_.n_embd;
  hd_ = shape_.head_dim();
  NHl_ = shape_.n_head / part_.tp;
  KVl_ = shape_.n_kv_head / part_.tp;
  Il_ = shape_.intermediate_size / part_.tp;
  Vp_l_ = shape_.padded_vocab_size / part_.tp;
  layout_ = ms::param_layout(shape_, part_);
  const Device dev = opt_.device;
  const size_t n = static_cast<size_t>(layout_.total);
  if (opt_.own_params) params_ = alloc_.allocate(n * dtype_size(opt_.dtype), MemTag::kParams, "llama parameters", dev);
  if (opt_.own_grads) {
    grads_ = alloc_.allocate(n * dtype_size(opt_.grad_dtype), MemTag::kGrads, "llama gradients", dev);
  }
  if (dev == Device::kCuda) {
    dev_ids_ = alloc_.allocate(2 * static_cast<size_t>(opt_.B) * opt_.T * sizeof(int32_t), MemTag::kWorkspace,
                               "llama device token ids", dev);
  }
  threads_ = omp_get_max_threads();
  // The CUDA attention needs no scratch: att_scratch is 0 floats there (as GPT-2's).
  ms::ActConfig cfg{opt_.B, opt_.T, opt_.recompute, dev == Device::kCuda ? 0 : threads_, opt_.head_chunk_rows,
                    static_cast<int>(dtype_size(opt_.dtype))};
  head_rows_ = cfg.head_chunk_rows > 0 ? cfg.head_chunk_rows
                                       : ms::head_chunk_rows_default(shape_, opt_.B, opt_.T, part_.tp);
  head_rows_ = std::min(head_rows_, opt_.B * opt_.T);
  cfg.head_chunk_rows = head_rows_;
  act_list_ = ms::llama_activations(shape_, part_, cfg);
  allocate_shared();
  if (rope_cos_ != nullptr) upload_rope_tables();
}

// The RoPE tables for T positions, computed on the host (fp32) and, on CUDA, copied once to the
// device.
void Llama::upload_rope_tables() {
  const size_t n = static_cast<size_t>(opt_.T) * (hd_ / 2);
  if (opt_.device != Device::kCuda) return cpu::rope_tables(rope_cos_, rope_sin_, opt_.T, hd_, shape_.rope_theta);
  std::vector<float> cs(n), sn(n);
  cpu::rope_tables(cs.data(), sn.data(), opt_.T, hd_, shape_.rope_theta);
  kern::DeviceScope scope(opt_.device, opt_.cuda_stream);
  kern::copy_from_host(rope_cos_, cs.data(), n * sizeof(float));
  kern::copy_from_host(rope_sin_, sn.data(), n * sizeof(float));
}

// Token ids for the kernels: the host ids on the CPU; on CUDA uploaded into slot 0 (inputs) or 1
// (targets) of the device buffer. Inside the caller's DeviceScope.
const int32_t* Llama::ids_for_kernels(const int32_t* host, int slot) {
  if (opt_.device != Device::kCuda) return host;
  const size_t n = static_cast<size_t>(opt_.B) * opt_.T;
  int32_t* dst = dev_ids_.as<int32_t>() + static_cast<size_t>(slot) * n;
  kern::copy_from_host(dst, host, n * sizeof(int32_t));
  return dst;
}

void Llama::allocate_shared() {
  const int sb = static_cast<int>(dtype_size(opt_.dtype));
  int64_t act_bytes = 0, ws_bytes = 0;
  for (const auto& b : act_list_) {
    if (b.scope == ms::ActScope::kShared) (b.tag == ms::ActTag::kActivations ? act_bytes : ws_bytes) += b.bytes(sb);
  }
  shared_act_ = alloc_.allocate(static_cast<size_t>(act_bytes), MemTag::kActivations, "llama shared activations",
                                opt_.device);
  shared_ws_ = alloc_.allocate(static_cast<size_t>(ws_bytes), MemTag::kWorkspace, "llama workspace", opt_.device);
  char* pa = static_cast<char*>(shared_act_.data());
  char* pw = static_cast<char*>(shared_ws_.data());
  for (const auto& b : act_list_) {
    if (b.scope == ms::ActScope::kShared) place_buffer(b, b.tag == ms::ActTag::kActivations ? pa : pw, &recompute_, nullptr);
  }
}

// Places buffer b at cursor: a layer's buffer into *layer, a micro-batch's into *mb, a shared one
// into the model's members (layer = the recompute buffers).
void Llama::place_buffer(const ms::ActBuffer& b, char*& cursor, LlamaLayerActs* layer, LlamaActivations* mb) {
  const std::string& nm = b.name;
  TypedPtr* typed = nullptr;
  float** stat = nullptr;
  if (const LayerSlot* s = layer_slot(nm); s != nullptr && layer != nullptr) {
    if (s->typed != nullptr) typed = &(layer->*(s->typed));
    else stat = &(layer->*(s->stat));
  } else if (mb != nullptr) {
    typed = nm == "input" ? &mb->input : nm == "lnf" ? &mb->lnf : nullptr;
    stat = nm == "lnf_rstd" ? &mb->lnf_rstd : nm == "losses" ? &mb->losses : nullptr;
  } else {
    typed = nm == "dres" ? &dres_ : nm == "dln" ? &dln_ : nm == "dqkv" ? &dqkv_ : nm == "datty" ? &datty_
          : nm == "dgu" ? &dgu_ : nm == "dact" ? &dact_ : nm == "logits" ? &logits_ : nullptr;
    stat = nm == "att_scratch" ? &att_scratch_ : nm == "ce_stats" ? &ce_stats_ : nm == "rope_cos" ? &rope_cos_
         : nm == "rope_sin" ? &rope_sin_ : nullptr;
  }
  DS_CHECK((typed != nullptr) != (stat != nullptr), "activation buffer {} has no view", nm);
  DS_CHECK((stat != nullptr) == b.fp32, "activation buffer {}: statistic or storage type mixed up", nm);
  if (typed != nullptr) *typed = TypedPtr(cursor, opt_.dtype);
  if (stat != nullptr) *stat = reinterpret_cast<float*>(cursor);
  cursor += b.bytes(static_cast<int>(dtype_size(opt_.dtype)));
}

LlamaActivations Llama::make_activations() {
  LlamaActivations a;
  const int nl = part_.layer_end - part_.layer_begin;
  const int sb = static_cast<int>(dtype_size(opt_.dtype));
  int64_t total = 0;
  for (const auto& b : act_list_) {
    if (b.scope == ms::ActScope::kPerLayer) total += b.bytes(sb) * nl;
    if (b.scope == ms::ActScope::kPerMicroBatch) total += b.bytes(sb);
  }
  a.buf_ = alloc_.allocate(static_cast<size_t>(total), MemTag::kActivations, "llama micro-batch activations",
                           opt_.device);
  a.layers.assign(static_cast<size_t>(nl), recompute_);
  char* cursor = static_cast<char*>(a.buf_.data());
  for (const auto& b : act_list_) {
    if (b.scope == ms::ActScope::kPerMicroBatch) place_buffer(b, cursor, nullptr, &a);
    if (b.scope != ms::ActScope::kPerLayer) continue;
    for (auto& la : a.layers) place_buffer(b, cursor, &la, nullptr);
  }
  DS_CHECK(cursor == static_cast<char*>(a.buf_.data()) + total);
  return a;
}

std::unique_ptr<Activations> Llama::new_activations() { return std::make_unique<LlamaActivations>(make_activations()); }

LlamaActivations& Llama::own(Activations& a) {
  auto* l = dynamic_cast<LlamaActivations*>(&a);
  if (l == nullptr) throw invalid_usage("a Llama model was handed another model's activations");
  return *l;
}

TypedPtr Llama::param(ParamId id, int layer) {
  const auto* t = layout_.find_tensor(id, layer);
  if (t == nullptr || params_.empty()) {
    throw invalid_argument("parameter {} (layer {}) is not held by this model part", ms::hf_name(id, layer), layer);
  }
  return params() + t->offset;
}

TypedPtr Llama::grad(ParamId id, int layer) {
  const auto* t = layout_.find_tensor(id, layer);
  if (t == nullptr || grads_.empty()) {
    throw invalid_argument("gradient of {} (layer {}) is not held by this model part", ms::hf_name(id, layer), layer);
  }
  return grads() + t->offset;
}

void Llama::init_weights(uint64_t seed) {
  if (params_.empty()) {
    throw invalid_usage("init_weights on a model built without its own parameters: generate each shard with "
                        "init_tensor_values");
  }
  // fp32 values, straight into fp32 CPU parameters; else through a host vector, rounded to the
  // storage type and copied to the model's device.
  std::vector<float> host;
  float* dst = params_.as<float>();
  if (opt_.dtype != DType::kF32 || opt_.device != Device::kCpu) {
    host.resize(static_cast<size_t>(layout_.total));
    dst = host.data();
  }
  const auto all = ms::model_params(shape_);
  for (const auto& ts : layout_.tensors) {
    init_tensor_values(dst + ts.offset, ms::find_param(all, ts.id), ts.layer, shape_.n_layer, part_.tp, part_.tp_rank,
                       seed, 0, ts.numel);
  }
  if (host.empty()) return;
  kern::DeviceScope scope(opt_.device, opt_.cuda_stream);
  tk::from_host_f32(params(), host.data(), layout_.total);
}

void Llama::zero_grads() {
  kern::DeviceScope scope(opt_.device, opt_.cuda_stream);
  if (!grads_.empty()) kern::fill_zero(grads_.data(), grads_.bytes());
}

LlamaLayerWeights Llama::layer_weights(TypedPtr base) const {
  auto at = [&](ParamId id) { return base + layout_.offset_in_unit(id); };
  return LlamaLayerWeights{at(ParamId::kAttnNorm), at(ParamId::kWq),    at(ParamId::kWo),
                           at(ParamId::kMlpNorm),  at(ParamId::kWgate), at(ParamId::kWdown)};
}

TypedPtr Llama::unit_params(Unit u) {
  const auto* s = layout_.find_unit(u.kind, u.layer);
  DS_CHECK(s != nullptr, "unit not in this part");
  const TypedPtr p = hooks_->params_needed(u, params_.empty() ? TypedPtr() : params() + s->offset);
  if (!p) throw invalid_usage("no parameters for a model unit (layer {}): built without them and no hook served them", u.layer);
  return p;
}

TypedPtr Llama::unit_grads(Unit u) {
  const auto* s = layout_.find_unit(u.kind, u.layer);
  DS_CHECK(s != nullptr, "unit not in this part");
  const TypedPtr g = hooks_->grads_needed(u, grads_.empty() ? TypedPtr() : grads() + s->offset);
  if (!g) throw invalid_usage("no gradient buffer for a model unit (layer {}): built without one and no hook served it", u.layer);
  return g;
}

void Llama::check_layers(int l0, int l1, const char* what) const {
  if (l0 < part_.layer_begin || l1 > part_.layer_end || l0 > l1) {
    throw invalid_argument("{}: layers [{}, {}) are not within this part's [{}, {})", what, l0, l1, part_.layer_begin,
                           part_.layer_end);
  }
  if (opt_.device != Device::kCuda && omp_get_max_threads() > threads_) {
    throw invalid_usage("{}: OpenMP now has {} threads but the model was built for {}: build the model after setting "
                        "the thread count",
                        what, omp_get_max_threads(), threads_);
  }
}

void Llama::check_tokens(const int32_t* ids, const char* what) const {
  const int64_t BT = static_cast<int64_t>(opt_.B) * opt_.T;
  for (int64_t i = 0; i < BT; i++) {
    if (ids[i] < 0 || ids[i] >= shape_.vocab_size) {
      throw invalid_argument("{} token {} at position {} (row {}, column {}) is outside the vocabulary [0, {})", what,
                             ids[i], i, i / opt_.T, i % opt_.T, shape_.vocab_size);
    }
  }
}

TypedPtr Llama::layer_input(LlamaActivations& a, int l) {
  return l == part_.layer_begin ? a.input : a.layers[static_cast<size_t>(l - 1 - part_.layer_begin)].out;
}

TypedPtr Llama::output(Activations& act) {
  LlamaActivations& a = own(act);
  return a.layers.empty() ? a.input : a.layers.back().out;
}

// ---- embedding (vocabulary-parallel on every tp size: tp 1 holds all the rows) --------------

void Llama::embed_forward(Activations& act, const int32_t* tokens) {
  if (!part_.has_embedding) throw invalid_usage("embed_forward on a part without the embedding");
  check_tokens(tokens, "input");
  LlamaActivations& a = own(act);
  kern::DeviceScope scope(opt_.device, opt_.cuda_stream);
  tokens = ids_for_kernels(tokens, 0);
  const Unit wte{UnitKind::kTokenEmbedding};
  tk::encoder_forward_vocab(a.input, tokens, unit_params(wte), opt_.B, opt_.T, C_, part_.tp_rank * Vp_l_, Vp_l_);
  if (part_.tp > 1) hooks_->tp_reduce_forward(a.input, static_cast<int64_t>(opt_.B) * opt_.T * C_);
  hooks_->params_done(wte);
}

void Llama::embed_backward(Activations&, const int32_t* tokens) {
  if (!part_.has_embedding) throw invalid_usage("embed_backward on a part without the embedding");
  kern::DeviceScope scope(opt_.device, opt_.cuda_stream);
  tokens = ids_for_kernels(tokens, 0);
  const Unit wte{UnitKind::kTokenEmbedding};
  tk::encoder_backward_vocab(unit_grads(wte), dres_, tokens, opt_.B, opt_.T, C_, part_.tp_rank * Vp_l_, Vp_l_);
  hooks_->grads_ready(wte);
}

// ---- decoder layers ----------------------------------------------------------------------------

void Llama::layer_forward(LlamaLayerActs& a, TypedPtr x, const LlamaLayerWeights& w, bool full) {
  const int B = opt_.B, T = opt_.T, C = C_;
  const int64_t BT = static_cast<int64_t>(B) * T, BTC = BT * C;
  const int Ql = NHl_ * hd_, QKVl = (NHl_ + 2 * KVl_) * hd_;
  const float eps = static_cast<float>(shape_.norm_eps);
  lk::rmsnorm_forward(a.ln1, a.ln1_rstd, x, w.attn_norm, BT, C, eps);
  tk::matmul_forward(a.qkv, a.ln1, w.wqkv, TypedPtr(), B, T, C, QKVl);
  lk::rope_forward(a.qkv, rope_cos_, rope_sin_, B, T, NHl_ + KVl_, hd_, QKVl, 0);  // q and k heads
  lk::attention_gqa_forward(a.atty, a.att_lse, a.qkv, att_scratch_, B, T, NHl_, KVl_, hd_);
  tk::matmul_forward(a.res2, a.atty, w.wo, TypedPtr(), B, T, Ql, C);
  hooks_->tp_reduce_forward(a.res2, BTC);
  tk::residual_forward(a.res2, a.res2, x, BTC);
  lk::rmsnorm_forward(a.ln2, a.ln2_rstd, a.res2, w.mlp_norm, BT, C, eps);
  tk::matmul_forward(a.gu, a.ln2, w.wgu, TypedPtr(), B, T, C, 2 * Il_);
  lk::swiglu_forward(a.act, a.gu, BT, Il_);
  if (!full) return;  // a recompute for backward needs nothing past here
  tk::matmul_forward(a.out, a.act, w.wdown, TypedPtr(), B, T, Il_, C);
  hooks_->tp_reduce_forward(a.out, BTC);
  tk::residual_forward(a.out, a.out, a.res2, BTC);
}

void Llama::layer_backward(LlamaLayerActs& a, TypedPtr x, const LlamaLayerWeights& w, const LlamaLayerWeights& g) {
  const int B = opt_.B, T = opt_.T, C = C_;
  const int64_t BT = static_cast<int64_t>(B) * T, BTC = BT * C;
  const int Ql = NHl_ * hd_, QKVl = (NHl_ + 2 * KVl_) * hd_;
  // dres holds d(out). MLP: out = res2 + down(swiglu(gu(n2(res2)))).
  tk::matmul_backward(dact_, g.wdown, TypedPtr(), dres_, a.act, w.wdown, B, T, Il_, C);
  lk::swiglu_backward(dgu_, dact_, a.gu, BT, Il_);
  tk::matmul_backward(dln_, g.wgu, TypedPtr(), dgu_, a.ln2, w.wgu, B, T, C, 2 * Il_);
  hooks_->tp_reduce_backward(dln_, BTC);
  lk::rmsnorm_backward(dres_, g.mlp_norm, dln_, a.res2, w.mlp_norm, a.ln2_rstd, BT, C);
  // dres holds d(res2). Attention: res2 = x + o(attn(rope(qkv(n1(x))))).
  tk::matmul_backward(datty_, g.wo, TypedPtr(), dres_, a.atty, w.wo, B, T, Ql, C);
  lk::attention_gqa_backward(dqkv_, datty_, a.qkv, a.atty, a.att_lse, att_scratch_, B, T, NHl_, KVl_, hd_);
  lk::rope_backward(dqkv_, rope_cos_, rope_sin_, B, T, NHl_ + KVl_, hd_, QKVl, 0);
  tk::matmul_backward(dln_, g.wqkv, TypedPtr(), dqkv_, a.ln1, w.wqkv, B, T, C, QKVl);
  hooks_->tp_reduce_backward(dln_, BTC);
  lk::rmsnorm_backward(dres_, g.attn_norm, dln_, x, w.attn_norm, a.ln1_rstd, BT, C);
}

void Llama::blocks_forward(Activations& act, int l0, int l1) {
  check_layers(l0, l1, "blocks_forward");
  LlamaActivations& a = own(act);
  kern::DeviceScope scope(opt_.device, opt_.cuda_stream);
  for (int l = l0; l < l1; l++) {
    const Unit u{UnitKind::kLayer, l};
    const LlamaLayerWeights w = layer_weights(unit_params(u));
    layer_forward(a.layers[static_cast<size_t>(l - part_.layer_begin)], layer_input(a, l), w, true);
    progress::bump();  // comm/beacon.h: a slow step is not a hang
    hooks_->params_done(u);
  }
}

void Llama::blocks_backward(Activations& act, int l0, int l1) {
  check_layers(l0, l1, "blocks_backward");
  LlamaActivations& a = own(act);
  kern::DeviceScope scope(opt_.device, opt_.cuda_stream);
  for (int l = l1 - 1; l >= l0; l--) {
    const Unit u{UnitKind::kLayer, l};
    const LlamaLayerWeights w = layer_weights(unit_params(u));
    const LlamaLayerWeights g = layer_weights(unit_grads(u));
    LlamaLayerActs& la = a.layers[static_cast<size_t>(l - part_.layer_begin)];
    const TypedPtr x = layer_input(a, l);
    if (opt_.recompute) layer_forward(la, x, w, false);
    layer_backward(la, x, w, g);  // dres: d(out) -> d(x)
    hooks_->params_done(u);
    hooks_->grads_ready(u);
    progress::bump();
  }
}

// ---- head: final RMSNorm, lm_head (or the tied embedding), loss --------------------------------

void Llama::head_chunks(LlamaActivations& a, const int32_t* targets, TypedPtr w, TypedPtr gw, bool backward,
                        float dloss) {
  const int C = C_, BT = opt_.B * opt_.T, V = shape_.vocab_size, Vp = Vp_l_;
  int64_t bad = 0;
  for (int r0 = 0; r0 < BT; r0 += head_rows_) {
    const int rows = std::min(head_rows_, BT - r0);
    const TypedPtr xin = a.lnf + static_cast<int64_t>(r0) * C;
    const TypedPtr dx = dln_ + static_cast<int64_t>(r0) * C;
    tk::matmul_forward(logits_, xin, w, TypedPtr(), 1, rows, C, Vp);
    if (part_.tp > 1) {
      const int v0 = part_.tp_rank * Vp_l_;
      float *mx = ce_stats_, *sumexp = ce_stats_ + rows, *tlogit = ce_stats_ + 2 * rows;
      tk::vocab_ce_max(mx, logits_, rows, Vp, v0, V);
      hooks_->tp_loss_reduce_max(mx, rows);
      tk::vocab_ce_sums(sumexp, tlogit, logits_, mx, targets + r0, rows, Vp, v0, V);
      hooks_->tp_loss_reduce_sum(ce_stats_ + rows, 2 * static_cast<int64_t>(rows));
      tk::vocab_ce_finish(a.losses + r0, backward ? logits_ : TypedPtr(), mx, sumexp, tlogit, targets + r0, dloss,
                          rows, Vp, v0, V);
      if (backward) {
        tk::matmul_backward(dx, gw, TypedPtr(), logits_, xin, w, 1, rows, C, Vp);
        hooks_->tp_reduce_backward(dx, static_cast<int64_t>(rows) * C);
      }
    } else if (backward) {
      bad += tk::crossentropy_softmax_backward(a.losses + r0, logits_, targets + r0, dloss, rows, V, Vp);
      tk::matmul_backward(dx, gw, TypedPtr(), logits_, xin, w, 1, rows, C, Vp);
    } else {
      bad += tk::crossentropy_forward(a.losses + r0, logits_, targets + r0, rows, V, Vp);
    }
  }
  DS_CHECK(bad == 0, "targets were validated");
}

float Llama::head(LlamaActivations& a, const int32_t* targets, bool backward, float grad_scale) {
  if (!part_.has_head) throw invalid_usage("head on a part without the head");
  check_tokens(targets, "target");
  kern::DeviceScope scope(opt_.device, opt_.cuda_stream);
  targets = ids_for_kernels(targets, 1);
  const int BT = opt_.B * opt_.T;
  const bool tied = shape_.tied();
  const Unit wte{UnitKind::kTokenEmbedding}, lnf{UnitKind::kFinalNorm};
  // The tied case asks for the units in GPT-2's order (embedding, then the final norm).
  const TypedPtr pte = tied ? unit_params(wte) : TypedPtr();
  const TypedPtr pf = unit_params(lnf);
  const TypedPtr normw = pf + layout_.offset_in_unit(ParamId::kLnfw);
  const TypedPtr w = tied ? pte : pf + layout_.offset_in_unit(ParamId::kLmHead);
  const TypedPtr x = output(a);
  lk::rmsnorm_forward(a.lnf, a.lnf_rstd, x, normw, BT, C_, static_cast<float>(shape_.norm_eps));
  TypedPtr gw, gf;
  if (backward && tied) gw = unit_grads(wte);
  if (backward) gf = unit_grads(lnf);
  if (backward && !tied) gw = gf + layout_.offset_in_unit(ParamId::kLmHead);
  head_chunks(a, targets, w, gw, backward, grad_scale / static_cast<float>(BT));
  if (backward) {
    tk::fill_zero(dres_, static_cast<int64_t>(BT) * C_);
    lk::rmsnorm_backward(dres_, gf + layout_.offset_in_unit(ParamId::kLnfw), dln_, x, normw, a.lnf_rstd, BT, C_);
    hooks_->grads_ready(lnf);
    if (tied && !part_.has_embedding) hooks_->grads_ready(wte);
  }
  if (tied) hooks_->params_done(wte);
  hooks_->params_done(lnf);
  // The per-token losses, on the host (on CUDA a copy back: the one synchronisation per micro-batch).
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

float Llama::head_forward(Activations& a, const int32_t* targets) { return head(own(a), targets, false, 0.0f); }

float Llama::head_forward_backward(Activations& a, const int32_t* targets, float grad_scale) {
  return head(own(a), targets, true, grad_scale);
}

}  // namespace ds::rt
