// The one decoder's forward and backward over flat buffers. See decoder.h for the contract; the
// family (model_spec/family.h) picks the norm, the positions and the MLP at the few places they
// differ, and everything else (attention as grouped-query for every family, the projections into
// the residual buffers, the head in chunks, the hooks at their named points) is one path.
#include "model/decoder.h"

#include <omp.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/error.h"
#include "common/progress.h"
#include "kernels/dispatch.h"
#include "kernels/typed.h"
#include "model/init.h"
#include "model_spec/mixtral_spec.h"
#include "model_spec/lora_spec.h"

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

// A layer's buffers by their model_spec names (both families' names): storage-typed views or fp32
// statistics.
struct LayerSlot {
  const char* name;
  TypedPtr DecoderLayerActs::*typed;
  float* DecoderLayerActs::*stat;
  int32_t* DecoderLayerActs::*ids = nullptr;  // int32 buffers (fp32-sized: ActBuffer::fp32)
};
constexpr LayerSlot kLayerSlots[] = {
    {"ln1", &DecoderLayerActs::ln1, nullptr},
    {"ln1_mean", nullptr, &DecoderLayerActs::ln1_mean},
    {"ln1_rstd", nullptr, &DecoderLayerActs::ln1_rstd},
    {"qkv", &DecoderLayerActs::qkv, nullptr},
    {"atty", &DecoderLayerActs::atty, nullptr},
    {"att_lse", nullptr, &DecoderLayerActs::att_lse},
    {"res2", &DecoderLayerActs::res2, nullptr},
    {"ln2", &DecoderLayerActs::ln2, nullptr},
    {"ln2_mean", nullptr, &DecoderLayerActs::ln2_mean},
    {"ln2_rstd", nullptr, &DecoderLayerActs::ln2_rstd},
    {"fch", &DecoderLayerActs::mlp_h, nullptr},
    {"gu", &DecoderLayerActs::mlp_h, nullptr},
    {"fch_gelu", &DecoderLayerActs::mlp_act, nullptr},
    {"act", &DecoderLayerActs::mlp_act, nullptr},
    {"moe_gu", &DecoderLayerActs::mlp_h, nullptr},
    {"moe_act", &DecoderLayerActs::mlp_act, nullptr},
    {"router_probs", nullptr, &DecoderLayerActs::router_probs},
    {"topk_w", nullptr, &DecoderLayerActs::topk_w},
    {"topk_idx", nullptr, nullptr, &DecoderLayerActs::topk_idx},
    {"moe_ex_x", &DecoderLayerActs::moe_ex_x, nullptr},
    {"moe_ep_counts", nullptr, nullptr, &DecoderLayerActs::moe_ep_counts},
    {"out", &DecoderLayerActs::out, nullptr},
};

// f(e, first row, rows) for every expert e < n with rows, in order: `off` (n + 1) holds where
// each expert's contiguous rows start.
template <typename F>
void for_each_expert(const std::vector<int32_t>& off, int n, F&& f) {
  for (int e = 0; e < n; e++) {
    const int rows = off[static_cast<size_t>(e) + 1] - off[static_cast<size_t>(e)];
    if (rows > 0) f(e, static_cast<int64_t>(off[static_cast<size_t>(e)]), rows);
  }
}

const LayerSlot* layer_slot(const std::string& name) {
  for (const auto& s : kLayerSlots) {
    if (name == s.name) return &s;
  }
  return nullptr;
}

}  // namespace

Decoder::Decoder(const ms::ModelShape& shape, const ms::ModelPart& part, const ModelOptions& options, Allocator& alloc,
                 ParallelHooks* hooks)
    : shape_(shape), part_(part), opt_(options), family_(ms::family_of(shape)), alloc_(alloc),
      hooks_(hooks != nullptr ? hooks : &default_hooks()) {
  shape_.validate();
  part_.validate(shape_);
  if (opt_.B <= 0 || opt_.T <= 0 || opt_.T > shape_.seq_len) {
    throw invalid_argument("micro-batch shape B={} T={} is invalid: need B > 0 and 0 < T <= model.seq_len ({})",
                           opt_.B, opt_.T, shape_.seq_len);
  }
  if (opt_.cp < 1 || opt_.cp_rank < 0 || opt_.cp_rank >= opt_.cp ||
      static_cast<int64_t>(opt_.T) * opt_.cp > shape_.seq_len) {
    throw invalid_argument("context parallelism: rank {} of {} holding T={} of each sequence: need 0 <= rank < cp "
                           "and T x cp <= model.seq_len ({})",
                           opt_.cp_rank, opt_.cp, opt_.T, shape_.seq_len);
  }
  if (auto why = layout::cp_sequence_rule(opt_.T * opt_.cp, opt_.cp, opt_.cp_method)) throw invalid_argument("{}", *why);
  runs_ = layout::cp_position_runs(opt_.T * opt_.cp, opt_.cp, opt_.cp_rank, opt_.cp_method);
  sp_ = opt_.sequence_parallel;
  const int64_t BT = static_cast<int64_t>(opt_.B) * opt_.T;
  if (sp_ && (part_.tp < 2 || BT % part_.tp != 0)) {
    throw invalid_argument("sequence parallelism needs tensor parallelism (tp {}) and the micro-batch's B x T = {} x {} "
                           "tokens divisible by it",
                           part_.tp, opt_.B, opt_.T);
  }
  Rl_ = sp_ ? BT / part_.tp : BT;
  for (int b = 0; b < opt_.B; b++) {
    for (const auto& run : runs_) full_segs_.push_back({static_cast<int64_t>(b) * opt_.T + run.local, run.global, run.length});
  }
  const int64_t lo = sp_ ? part_.tp_rank * Rl_ : 0, hi = lo + Rl_;
  for (const auto& seg : full_segs_) {  // the part of each segment within this rank's rows
    const int64_t a = std::max(lo, seg.row), z = std::min(hi, seg.row + seg.length);
    if (a < z) local_segs_.push_back({a - lo, seg.position + static_cast<int>(a - seg.row), static_cast<int>(z - a)});
  }
  packing_ = opt_.document_token >= 0;
  if (packing_ && (opt_.cp > 1 || opt_.document_token >= shape_.vocab_size)) {
    throw invalid_argument("document-aware packing: document token {} with context parallelism {}: need a token in "
                           "[0, {}) and cp 1",
                           opt_.document_token, opt_.cp, shape_.vocab_size);
  }
  if (opt_.device == Device::kCudaHost) {
    throw invalid_argument("ModelOptions::device: pinned host memory (kCudaHost) is for offload buffers; the model "
                           "runs on kCpu or kCuda");
  }
  if (opt_.grad_dtype != opt_.dtype && opt_.grad_dtype != DType::kF32) {
    throw invalid_argument("ModelOptions: gradients of type {} for {} storage: gradients are stored in the storage "
                           "type or in fp32",
                           dtype_name(opt_.grad_dtype), dtype_name(opt_.dtype));
  }
  layer_norm_ = family_.norm == ms::NormKind::kLayerNorm;
  rope_ = family_.positions == ms::PositionKind::kRope;
  swiglu_ = family_.mlp == ms::MlpKind::kSwiGlu;
  moe_ = family_.mlp == ms::MlpKind::kMoe;
  if (moe_) {
    E_ = shape_.num_local_experts;
    k_ = shape_.num_experts_per_tok;
    moe_offsets_host_.assign(static_cast<size_t>(E_) + 1, 0);
    moe_host_e_.assign(static_cast<size_t>(E_), 0.0f);
    ep_ = part_.ep;
    El_ = E_ / ep_;
    Rmax_ = ms::moe_expert_rows(shape_, part_, static_cast<int64_t>(opt_.B) * opt_.T);
  } else if (part_.ep > 1) {
    throw invalid_argument("expert parallelism ({} ranks) needs a mixture of experts; model.type {} has none", part_.ep,
                           family_.name);
  }
  lora_ = shape_.lora.on();
  if (lora_ && moe_) {
    throw invalid_argument("LoRA on a mixture of experts ({}) is not built: its experts' region and the adapters' "
                           "would need a third parameter region",
                           family_.display_name);
  }
  norm_eps_ = static_cast<float>(shape_.norm_eps);
  C_ = shape_.n_embd;
  hd_ = shape_.head_dim();
  NHl_ = shape_.n_head / part_.tp;
  KVl_ = ms::kv_heads(shape_) / part_.tp;
  Hl_ = ms::mlp_width(shape_) / part_.tp;
  Vp_l_ = shape_.padded_vocab_size / part_.tp;
  layout_ = ms::param_layout(shape_, part_);
  for (const auto& t : family_.params(shape_)) expert_param_[static_cast<size_t>(t.id)] = t.unit == UnitKind::kExperts;
  const Device dev = opt_.device;
  const size_t n = static_cast<size_t>(layout_.total);
  const std::string name = family_.name;
  // LoRA: the frozen base [0, adapter_begin) is always the model's own and has no gradients; the
  // adapters follow the ownership options like a whole model's parameters.
  const size_t base = static_cast<size_t>(layout_.adapter_begin);
  const size_t n_params = opt_.own_params ? n : lora_ ? base : 0;
  if (n_params > 0) {
    params_ = alloc_.allocate(n_params * dtype_size(opt_.dtype), MemTag::kParams, name + " parameters", dev);
  }
  if (opt_.own_grads) {
    const size_t n_grads = lora_ ? n - base : n;
    grads_ = alloc_.allocate(n_grads * dtype_size(opt_.grad_dtype), MemTag::kGrads, name + " gradients", dev);
  }
  if (dev == Device::kCuda) {
    dev_ids_ = alloc_.allocate(2 * static_cast<size_t>(opt_.B) * opt_.T * sizeof(int32_t), MemTag::kWorkspace,
                               name + " device token ids", dev);
  }
  threads_ = omp_get_max_threads();
  // The CUDA attention needs no scratch (kern attention_scratch_floats is 0 there), nor does a
  // context-parallel rank (its attention, parallel/context_parallel.h, keeps its own).
  ms::ActConfig cfg{opt_.B, opt_.T, opt_.recompute, dev == Device::kCuda || opt_.cp > 1 ? 0 : threads_, opt_.head_chunk_rows,
                    static_cast<int>(dtype_size(opt_.dtype)), sp_};
  head_rows_ = cfg.head_chunk_rows > 0 ? cfg.head_chunk_rows
                                       : ms::head_chunk_rows_default(shape_, opt_.B, opt_.T, part_.tp);
  head_rows_ = std::min(head_rows_, opt_.B * opt_.T);
  cfg.head_chunk_rows = head_rows_;
  act_list_ = ms::model_activations(shape_, part_, cfg);
  allocate_shared();
  if (lora_) init_lora_sites();
  if (rope_cos_ != nullptr) upload_rope_tables();
}

void Decoder::allocate_shared() {
  const int sb = static_cast<int>(dtype_size(opt_.dtype));
  int64_t act_bytes = 0, ws_bytes = 0;
  for (const auto& b : act_list_) {
    if (b.scope == ms::ActScope::kShared) (b.tag == ms::ActTag::kActivations ? act_bytes : ws_bytes) += b.bytes(sb);
  }
  const std::string name = family_.name;
  shared_act_ = alloc_.allocate(static_cast<size_t>(act_bytes), MemTag::kActivations, name + " shared activations",
                                opt_.device);
  shared_ws_ = alloc_.allocate(static_cast<size_t>(ws_bytes), MemTag::kWorkspace, name + " workspace", opt_.device);
  char* pa = static_cast<char*>(shared_act_.data());
  char* pw = static_cast<char*>(shared_ws_.data());
  for (const auto& b : act_list_) {
    if (b.scope == ms::ActScope::kShared) place_buffer(b, b.tag == ms::ActTag::kActivations ? pa : pw, &recompute_, nullptr);
  }
  // GELU's backward runs in place in the MLP's input gradient; SwiGLU's needs its own.
  if (!dmlp_act_) dmlp_act_ = dmlp_h_;
}

// The RoPE tables of this rank's T positions (their global indices under context parallelism),
// computed on the host (fp32) and, on CUDA, copied once to the device.
void Decoder::upload_rope_tables() {
  const int half = hd_ / 2;
  const size_t n = static_cast<size_t>(opt_.T) * half;
  if (opt_.device != Device::kCuda && opt_.cp == 1) {
    return cpu::rope_tables(rope_cos_, rope_sin_, opt_.T, hd_, shape_.rope_theta);
  }
  const int Tg = opt_.T * opt_.cp;
  std::vector<float> gc(static_cast<size_t>(Tg) * half), gs(gc.size()), cs(n), sn(n);
  cpu::rope_tables(gc.data(), gs.data(), Tg, hd_, shape_.rope_theta);
  for (const auto& run : runs_) {
    const size_t from = static_cast<size_t>(run.global) * half, to = static_cast<size_t>(run.local) * half;
    std::copy_n(gc.begin() + from, static_cast<size_t>(run.length) * half, cs.begin() + to);
    std::copy_n(gs.begin() + from, static_cast<size_t>(run.length) * half, sn.begin() + to);
  }
  kern::DeviceScope scope(opt_.device, opt_.cuda_stream);
  kern::copy_from_host(rope_cos_, cs.data(), n * sizeof(float));
  kern::copy_from_host(rope_sin_, sn.data(), n * sizeof(float));
}

// The learned position embedding of this rank's rows, a segment of consecutive positions at a
// time (context parallelism holds two runs of each sequence; sequence parallelism a share of the
// flattened rows).
void Decoder::add_positions(TypedPtr x, TypedPtr wpe, const std::vector<PositionSegment>& segs) {
  for (const auto& seg : segs) {
    tk::add_position(x + seg.row * C_, wpe + static_cast<int64_t>(seg.position) * C_, 1, seg.length, C_);
  }
}

void Decoder::add_positions_backward(TypedPtr dwpe, TypedPtr src, const int32_t* tokens,
                                     const std::vector<PositionSegment>& segs) {
  for (const auto& seg : segs) {
    tk::encoder_backward(TypedPtr(), dwpe + static_cast<int64_t>(seg.position) * C_, src + seg.row * C_,
                         tokens + seg.row, 1, seg.length, C_);
  }
}

TypedPtr Decoder::gathered(TypedPtr local) {
  if (!sp_) return local;
  hooks_->tp_all_gather(sp_gather_, local, Rl_ * C_);
  return sp_gather_;
}

void Decoder::reduce_rows(TypedPtr local, TypedPtr full, bool forward) {
  const int64_t BTC = static_cast<int64_t>(opt_.B) * opt_.T * C_;
  if (sp_) {
    hooks_->tp_reduce_scatter(local, full, Rl_ * C_);
  } else if (forward) {
    hooks_->tp_reduce_forward(full, BTC);
  } else {
    hooks_->tp_reduce_backward(full, BTC);
  }
}

void Decoder::sum_norm_grads(TypedPtr dw, TypedPtr db) {
  if (!sp_ || !dw) return;  // null: frozen (LoRA)
  hooks_->tp_sum_partial_grads(dw, C_);
  if (db) hooks_->tp_sum_partial_grads(db, C_);
}

void Decoder::place_buffer(const ms::ActBuffer& b, char*& cursor, DecoderLayerActs* layer, DecoderActivations* mb) {
  const std::string& nm = b.name;
  TypedPtr* typed = nullptr;
  float** stat = nullptr;
  int32_t** ids = nullptr;
  if (const LayerSlot* s = layer_slot(nm); s != nullptr && layer != nullptr) {
    if (s->typed != nullptr) typed = &(layer->*(s->typed));
    else if (s->stat != nullptr) stat = &(layer->*(s->stat));
    else ids = &(layer->*(s->ids));
  } else if (mb != nullptr) {
    typed = nm == "input" ? &mb->input : nm == "lnf" ? &mb->lnf : nullptr;
    stat = nm == "lnf_mean" ? &mb->lnf_mean : nm == "lnf_rstd" ? &mb->lnf_rstd : nm == "losses" ? &mb->losses
         : nm == "router_wire" ? &mb->router_wire : nullptr;
  } else {
    typed = nm == "dres" ? &dres_ : nm == "dln" ? &dln_ : nm == "dqkv" ? &dqkv_ : nm == "datty" ? &datty_
          : nm == "sp_gather" ? &sp_gather_ : nm == "dln_sp" ? &dln_sp_
          : nm == "dfch" || nm == "dgu" || nm == "moe_dgu" ? &dmlp_h_ : nm == "dact" || nm == "moe_dact" ? &dmlp_act_
          : nm == "logits" ? &logits_ : nm == "router_logits" ? &router_logits_ : nm == "moe_xs" ? &moe_xs_
          : nm == "moe_ys" ? &moe_ys_ : nm == "moe_recv" ? &moe_recv_ : nm == "lora_t" ? &lora_t_
          : nm == "lora_dt" ? &lora_dt_ : nm == "lora_u" ? &lora_u_ : nm == "lora_dx" ? &lora_dx_
          : nm == "lora_x" ? &lora_x_ : nullptr;
    stat = nm == "att_scratch" ? &att_scratch_ : nm == "ce_stats" ? &ce_stats_ : nm == "rope_cos" ? &rope_cos_
         : nm == "rope_sin" ? &rope_sin_ : nm == "moe_dw" ? &moe_dw_ : nm == "moe_daux" ? &moe_daux_
         : nm == "moe_fbuf" ? &moe_fbuf_ : nm == "moe_ex_w" ? &moe_ex_w_ : nullptr;
    ids = nm == "moe_slots" ? &moe_slots_ : nm == "moe_pos" ? &moe_pos_ : nm == "moe_offsets" ? &moe_offsets_
        : nm == "moe_perm" ? &moe_perm_ : nm == "moe_cnt_send" ? &moe_cnt_send_ : nullptr;
  }
  DS_CHECK((typed != nullptr) + (stat != nullptr) + (ids != nullptr) == 1, "activation buffer {} has no view", nm);
  DS_CHECK((typed == nullptr) == b.fp32, "activation buffer {}: statistic or storage type mixed up", nm);
  if (typed != nullptr) *typed = TypedPtr(cursor, opt_.dtype);
  if (stat != nullptr) *stat = reinterpret_cast<float*>(cursor);
  if (ids != nullptr) *ids = reinterpret_cast<int32_t*>(cursor);
  cursor += b.bytes(static_cast<int>(dtype_size(opt_.dtype)));
}

DecoderActivations Decoder::make_activations() {
  DecoderActivations a;
  const int nl = part_.layer_end - part_.layer_begin;
  const int sb = static_cast<int>(dtype_size(opt_.dtype));
  int64_t total = 0;
  for (const auto& b : act_list_) {
    if (b.scope == ms::ActScope::kPerLayer) total += b.bytes(sb) * nl;
    if (b.scope == ms::ActScope::kPerMicroBatch) total += b.bytes(sb);
  }
  a.buf_ = alloc_.allocate(static_cast<size_t>(total), MemTag::kActivations,
                           std::string(family_.name) + " micro-batch activations", opt_.device);
  a.layers.assign(static_cast<size_t>(nl), recompute_);
  if (moe_) a.router.reset(E_);
  char* cursor = static_cast<char*>(a.buf_.data());
  for (const auto& b : act_list_) {
    if (b.scope == ms::ActScope::kPerMicroBatch) place_buffer(b, cursor, nullptr, &a);
    if (b.scope != ms::ActScope::kPerLayer) continue;
    for (auto& la : a.layers) place_buffer(b, cursor, &la, nullptr);
  }
  DS_CHECK(cursor == static_cast<char*>(a.buf_.data()) + total);
  if (packing_) {
    a.doc_buf = alloc_.allocate(static_cast<size_t>(opt_.B) * opt_.T * sizeof(int32_t), MemTag::kWorkspace,
                                std::string(family_.name) + " document starts", opt_.device);
    a.doc_start = a.doc_buf.as<int32_t>();
  }
  return a;
}

std::unique_ptr<Activations> Decoder::new_activations() {
  return std::make_unique<DecoderActivations>(make_activations());
}

DecoderActivations& Decoder::own(Activations& a) {
  auto* d = dynamic_cast<DecoderActivations*>(&a);
  if (d == nullptr) throw invalid_usage("a decoder was handed activations it did not make");
  return *d;
}

TypedPtr Decoder::param(ParamId id, int layer) {
  const auto* t = layout_.find_tensor(id, layer);
  if (t == nullptr || t->offset + t->numel > params_held()) {
    throw invalid_argument("parameter {} (layer {}) is not held by this model part",
                           ms::find_param(ms::model_params(shape_), id).name, layer);
  }
  return params() + t->offset;
}

TypedPtr Decoder::grad(ParamId id, int layer) {
  const auto* t = layout_.find_tensor(id, layer);
  const int64_t first = lora_ ? layout_.adapter_begin : 0;  // LoRA: the adapters' gradients only
  if (t == nullptr || grads_.empty() || t->offset < first) {
    throw invalid_argument("gradient of {} (layer {}) is not held by this model part{}",
                           ms::find_param(ms::model_params(shape_), id).name, layer,
                           lora_ && t != nullptr ? " (a LoRA run's base is frozen: it has no gradients)" : "");
  }
  return grads() + (t->offset - first);
}

void Decoder::init_weights(uint64_t seed) {
  if (params_.empty()) {
    throw invalid_usage("init_weights on a model built without its own parameters: generate each shard with "
                        "init_tensor_values");
  }
  // fp32 values on the host (transient, outside the allocator), then into the storage type on the
  // model's device; on an fp32 CPU model straight into the parameters.
  const bool direct = opt_.device == Device::kCpu && opt_.dtype == DType::kF32;
  std::vector<float> host;
  float* dst = direct ? params_.as<float>() : nullptr;
  // Without its own adapters (LoRA under ZeRO-3) the model holds the base only.
  const int64_t held = params_held();
  if (!direct) {
    host.resize(static_cast<size_t>(held));
    dst = host.data();
  }
  const auto all = ms::model_params(shape_);
  for (const auto& ts : layout_.tensors) {
    if (ts.offset + ts.numel > held) continue;
    init_tensor_values(dst + ts.offset, ms::find_param(all, ts.id), ts.layer, shape_.n_layer, part_.tp, part_.tp_rank,
                       seed, 0, ts.numel, part_.ep, part_.ep_rank);
  }
  if (direct) return;
  kern::DeviceScope scope(opt_.device, opt_.cuda_stream);
  tk::from_host_f32(params(), host.data(), held);
}

void Decoder::zero_grads() {
  kern::DeviceScope scope(opt_.device, opt_.cuda_stream);
  if (!grads_.empty()) kern::fill_zero(grads_.data(), grads_.bytes());
}

const int32_t* Decoder::ids_for_kernels(const int32_t* host, int slot) {
  if (opt_.device != Device::kCuda) return host;
  const size_t n = static_cast<size_t>(opt_.B) * opt_.T;
  int32_t* dst = dev_ids_.as<int32_t>() + static_cast<size_t>(slot) * n;
  kern::copy_from_host(dst, host, n * sizeof(int32_t));
  return dst;
}

DecoderLayerWeights Decoder::layer_weights(TypedPtr base, TypedPtr experts) const {
  const ms::LayerRoles& r = family_.roles;
  auto at = [&](ParamId id) {  // null when the unit is (a frozen base's gradients)
    return (expert_param_[static_cast<size_t>(id)] ? experts : base) + layout_.offset_in_unit(id);
  };
  auto opt = [&](const std::optional<ParamId>& id) { return id ? at(*id) : TypedPtr(); };
  return DecoderLayerWeights{at(r.norm1_w), opt(r.norm1_b), at(r.qkv_w),  opt(r.qkv_b),
                             at(r.proj_w),  opt(r.proj_b),  at(r.norm2_w), opt(r.norm2_b),
                             at(r.up_w),    opt(r.up_b),    at(r.down_w), opt(r.down_b),
                             opt(r.router_w)};
}

TypedPtr Decoder::unit_params(Unit u) {
  const auto* s = layout_.find_unit(u.kind, u.layer);
  DS_CHECK(s != nullptr, "unit not in this part");
  if (frozen(u)) return params() + s->offset;  // LoRA's base: the model's own
  const TypedPtr p = hooks_->params_needed(u, s->offset < params_held() ? params() + s->offset : TypedPtr());
  if (!p) {
    throw invalid_usage("no parameters for a model unit (layer {}): the model was built without its own parameters "
                        "and the parallel hooks returned none",
                        u.layer);
  }
  return p;
}

TypedPtr Decoder::unit_grads(Unit u) {
  const auto* s = layout_.find_unit(u.kind, u.layer);
  DS_CHECK(s != nullptr, "unit not in this part");
  if (frozen(u)) return TypedPtr();  // LoRA's base: no gradients
  const int64_t first = lora_ ? layout_.adapter_begin : 0;
  const TypedPtr g = hooks_->grads_needed(u, grads_.empty() ? TypedPtr() : grads() + (s->offset - first));
  if (!g) {
    throw invalid_usage("no gradient buffer for a model unit (layer {}): the model was built without its own "
                        "gradients and the parallel hooks returned none",
                        u.layer);
  }
  return g;
}

void Decoder::check_layers(int l0, int l1, const char* what) const {
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

void Decoder::check_tokens(const int32_t* ids, const char* what, bool allow_ignore) const {
  const int64_t BT = static_cast<int64_t>(opt_.B) * opt_.T;
  for (int64_t i = 0; i < BT; i++) {
    if (allow_ignore && ids[i] == -1) continue;  // kIgnoreTarget: a masked-out target
    if (ids[i] < 0 || ids[i] >= shape_.vocab_size) {
      throw invalid_argument("{} token {} at position {} (row {}, column {}) is outside the vocabulary [0, {})", what,
                             ids[i], i, i / opt_.T, i % opt_.T, shape_.vocab_size);
    }
  }
}

TypedPtr Decoder::layer_input(DecoderActivations& a, int l) {
  return l == part_.layer_begin ? a.input : a.layers[static_cast<size_t>(l - 1 - part_.layer_begin)].out;
}

TypedPtr Decoder::output(DecoderActivations& a) { return a.layers.empty() ? a.input : a.layers.back().out; }

// ---- documents (packing) ----------------------------------------------------------------------------

// Each row's document starts at the last document token at or before it (index 0 when the window
// has none before it): one pass per sequence. The starts go to the kernels' memory; each document
// is one segment of consecutive positions from 0, cut to this rank's rows under sequence
// parallelism as the constructor cuts full_segs_.
void Decoder::find_documents(DecoderActivations& a, const int32_t* tokens) {
  if (!packing_) return;
  if (tokens == nullptr) {
    throw invalid_argument("document-aware packing needs the micro-batch's input tokens on every pipeline stage "
                           "(they give the document starts)");
  }
  const int B = opt_.B, T = opt_.T;
  std::vector<int32_t> starts(static_cast<size_t>(B) * T);
  a.doc_segs.clear();
  a.doc_local_segs.clear();
  for (int b = 0; b < B; b++) {
    const int64_t r0 = static_cast<int64_t>(b) * T;
    int start = 0;
    for (int t = 0; t < T; t++) {
      if (tokens[r0 + t] == opt_.document_token && t > start) {
        a.doc_segs.push_back({r0 + start, 0, t - start});
        start = t;
      }
      starts[static_cast<size_t>(r0 + t)] = start;
    }
    a.doc_segs.push_back({r0 + start, 0, T - start});
  }
  const int64_t lo = sp_ ? part_.tp_rank * Rl_ : 0, hi = lo + Rl_;
  for (const auto& seg : a.doc_segs) {
    const int64_t x = std::max(lo, seg.row), z = std::min(hi, seg.row + seg.length);
    if (x < z) a.doc_local_segs.push_back({x - lo, seg.position + static_cast<int>(x - seg.row), static_cast<int>(z - x)});
  }
  kern::DeviceScope scope(opt_.device, opt_.cuda_stream);
  kern::copy_from_host(a.doc_start, starts.data(), starts.size() * sizeof(int32_t));
}

// RoPE of q and k (the first NHl + KVl heads of each qkv row): the table row of each row's
// position, one document segment at a time under packing.
void Decoder::rope(TypedPtr qkv, const DecoderActivations& mb, bool backward) {
  const int QKVl = (NHl_ + 2 * KVl_) * hd_, heads = NHl_ + KVl_;
  auto apply = [&](TypedPtr x, const float* c, const float* sn, int B, int T) {
    if (backward) {
      tk::rope_backward(x, c, sn, B, T, heads, hd_, QKVl, 0);
    } else {
      tk::rope_forward(x, c, sn, B, T, heads, hd_, QKVl, 0);
    }
  };
  if (!packing_) return apply(qkv, rope_cos_, rope_sin_, opt_.B, opt_.T);
  const int64_t half = hd_ / 2;
  for (const auto& seg : mb.doc_segs) {
    apply(qkv + seg.row * QKVl, rope_cos_ + seg.position * half, rope_sin_ + seg.position * half, 1, seg.length);
  }
}

// ---- embedding -----------------------------------------------------------------------------------

void Decoder::embed_forward(DecoderActivations& a, const int32_t* tokens) {
  if (!part_.has_embedding) throw invalid_usage("embed_forward on a part without the embedding");
  check_tokens(tokens, "input");
  find_documents(a, tokens);
  if (moe_) a.router.reset(E_);
  kern::DeviceScope scope(opt_.device, opt_.cuda_stream);
  tokens = ids_for_kernels(tokens, 0);
  const Unit wte{UnitKind::kTokenEmbedding}, wpe{UnitKind::kPositionEmbedding};
  const TypedPtr pte = unit_params(wte);
  const TypedPtr ppe = rope_ ? TypedPtr() : unit_params(wpe);
  if (!rope_ && part_.tp == 1 && opt_.cp == 1 && !packing_) {
    tk::encoder_forward(a.input, tokens, pte, ppe, opt_.B, opt_.T, C_);  // tokens and positions in one pass
  } else {
    // Vocabulary-parallel (tp 1 holds every row): each rank embeds the tokens of its rows, the
    // group sums (sequence parallelism: each rank keeps its share of the rows), then a learned
    // position embedding (replicated) is added once, at the rows' global positions.
    const TypedPtr full = sp_ ? sp_gather_ : a.input;
    tk::encoder_forward_vocab(full, tokens, pte, opt_.B, opt_.T, C_, part_.tp_rank * Vp_l_, Vp_l_);
    if (part_.tp > 1) reduce_rows(a.input, full, true);
    if (!rope_) add_positions(a.input, ppe, packing_ ? a.doc_local_segs : local_segs_);
  }
  params_done(wte);
  if (!rope_) params_done(wpe);
}

void Decoder::embed_backward(DecoderActivations& a, const int32_t* tokens) {
  if (!part_.has_embedding) throw invalid_usage("embed_backward on a part without the embedding");
  if (lora_) return;  // a frozen embedding: the gradient stops at the first layer's input
  kern::DeviceScope scope(opt_.device, opt_.cuda_stream);
  tokens = ids_for_kernels(tokens, 0);
  const Unit wte{UnitKind::kTokenEmbedding}, wpe{UnitKind::kPositionEmbedding};
  if (!rope_ && part_.tp == 1 && opt_.cp == 1 && !packing_) {
    tk::encoder_backward(unit_grads(wte), unit_grads(wpe), dres_, tokens, opt_.B, opt_.T, C_);
  } else {
    // Every row's gradient (all-gathered under sequence parallelism): each rank's vocabulary rows,
    // and the replicated wpe's gradient the same on every tp rank.
    const TypedPtr d = gathered(dres_);
    tk::encoder_backward_vocab(unit_grads(wte), d, tokens, opt_.B, opt_.T, C_, part_.tp_rank * Vp_l_, Vp_l_);
    if (!rope_) add_positions_backward(unit_grads(wpe), d, tokens, packing_ ? a.doc_segs : full_segs_);
  }
  if (!rope_) grads_ready(wpe);
  grads_ready(wte);
}

// ---- decoder blocks ------------------------------------------------------------------------------

void Decoder::norm_forward(TypedPtr out, float* mean, float* rstd, TypedPtr x, TypedPtr w, TypedPtr b) {
  if (layer_norm_) {
    tk::layernorm_forward(out, mean, rstd, x, w, b, 1, static_cast<int>(Rl_), C_);
  } else {
    tk::rmsnorm_forward(out, rstd, x, w, Rl_, C_, norm_eps_);
  }
}

void Decoder::norm_backward(TypedPtr dx, TypedPtr dw, TypedPtr db, TypedPtr dout, TypedPtr x, TypedPtr w,
                            const float* mean, const float* rstd) {
  if (layer_norm_) {
    tk::layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, 1, static_cast<int>(Rl_), C_);
  } else {
    tk::rmsnorm_backward(dx, dw, dout, x, w, rstd, Rl_, C_);
  }
}

void Decoder::layer_forward(DecoderLayerActs& a, TypedPtr x, const DecoderLayerWeights& w, bool full,
                            RouterStats* stats, const DecoderActivations& mb) {
  const int B = opt_.B, T = opt_.T, C = C_;
  const int64_t BT = static_cast<int64_t>(B) * T, RlC = Rl_ * C;
  const int Ql = NHl_ * hd_, QKVl = (NHl_ + 2 * KVl_) * hd_, UPl = swiglu_ ? 2 * Hl_ : Hl_;
  const int rows = static_cast<int>(Rl_);
  // Sequence parallelism: the norms and the residual adds run on this rank's rows; the
  // column-parallel matmuls read the all-gathered norm output (sp_gather_), and the row-parallel
  // ones write their partial sums there, reduce-scattered into this rank's rows.
  norm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, w.norm1_w, w.norm1_b);
  const TypedPtr x1 = gathered(a.ln1);
  tk::matmul_forward(a.qkv, x1, w.qkv_w, w.qkv_b, B, T, C, QKVl);
  if (lora_) lora_forward(kLoraQkv, a.qkv, QKVl, x1, w.adapters);
  if (rope_) rope(a.qkv, mb, false);  // q and k heads
  if (opt_.cp > 1) {
    DS_CHECK(hooks_->cp_attention_forward(a.atty, a.att_lse, a.qkv), "context parallelism without a cp attention hook");
  } else if (packing_) {
    tk::attention_gqa_doc_forward(a.atty, a.att_lse, a.qkv, mb.doc_start, att_scratch_, B, T, NHl_, KVl_, hd_);
  } else {
    tk::attention_gqa_forward(a.atty, a.att_lse, a.qkv, att_scratch_, B, T, NHl_, KVl_, hd_);
  }
  // Row-parallel projection (straight into res2 without sp), reduced over tp, then bias and residual.
  const TypedPtr proj = sp_ ? sp_gather_ : a.res2;
  tk::matmul_forward(proj, a.atty, w.proj_w, TypedPtr(), B, T, Ql, C);
  if (lora_) lora_forward(kLoraProj, proj, C, a.atty, w.adapters);
  reduce_rows(a.res2, proj, true);
  if (w.proj_b) tk::add_bias(a.res2, w.proj_b, rows, C);
  tk::residual_forward(a.res2, a.res2, x, RlC);
  norm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, w.norm2_w, w.norm2_b);
  if (moe_) {
    const TypedPtr y = sp_ ? sp_gather_ : a.out;  // written only after the gathered input is read
    moe_forward(a, gathered(a.ln2), w, y, full, stats);
    if (!full) return;
    reduce_rows(a.out, y, true);
    tk::residual_forward(a.out, a.out, a.res2, RlC);
    return;
  }
  const TypedPtr x2 = gathered(a.ln2);
  tk::matmul_forward(a.mlp_h, x2, w.up_w, w.up_b, B, T, C, UPl);
  if (lora_) lora_forward(kLoraUp, a.mlp_h, UPl, x2, w.adapters);
  if (swiglu_) {
    tk::swiglu_forward(a.mlp_act, a.mlp_h, BT, Hl_);
  } else {
    tk::gelu_forward(a.mlp_act, a.mlp_h, BT * Hl_);
  }
  if (!full) return;  // a recompute for backward needs nothing past here
  const TypedPtr down = sp_ ? sp_gather_ : a.out;
  tk::matmul_forward(down, a.mlp_act, w.down_w, TypedPtr(), B, T, Hl_, C);
  if (lora_) lora_forward(kLoraDown, down, C, a.mlp_act, w.adapters);
  reduce_rows(a.out, down, true);
  if (w.down_b) tk::add_bias(a.out, w.down_b, rows, C);
  tk::residual_forward(a.out, a.out, a.res2, RlC);
}

void Decoder::layer_backward(DecoderLayerActs& a, TypedPtr x, const DecoderLayerWeights& w,
                             const DecoderLayerWeights& g, const DecoderActivations& mb) {
  const int B = opt_.B, T = opt_.T, C = C_;
  const int64_t BT = static_cast<int64_t>(B) * T;
  const int Ql = NHl_ * hd_, QKVl = (NHl_ + 2 * KVl_) * hd_, UPl = swiglu_ ? 2 * Hl_ : Hl_;
  // Under sequence parallelism dres_ holds this rank's rows: the row-parallel matmuls' backward
  // reads them all-gathered, the column-parallel input gradients (dln_, every row) are
  // reduce-scattered into dln_sp_, and the norms' weight gradients are summed over tp.
  const TypedPtr dln = sp_ ? dln_sp_ : dln_;
  // dres holds d(out). MLP: out = res2 + down(act(up(norm2(res2)))).
  if (moe_) {
    // The gathered d(out) goes to moe_ys_ / moe_xs_ before sp_gather_ is reused for ln2.
    moe_backward(a, a.ln2, gathered(dres_), w, g, mb.router, mb.grad_scale);
  } else {
    const TypedPtr dy = gathered(dres_);
    tk::matmul_backward(dmlp_act_, g.down_w, g.down_b, dy, a.mlp_act, w.down_w, B, T, Hl_, C);
    if (lora_) lora_backward(kLoraDown, dy, C, a.mlp_act, dmlp_act_, w.adapters, g.adapters);
    if (swiglu_) {
      tk::swiglu_backward(dmlp_h_, dmlp_act_, a.mlp_h, BT, Hl_);
    } else {
      tk::gelu_backward(dmlp_h_, a.mlp_h, dmlp_act_, BT * Hl_);  // in place: dmlp_act_ is dmlp_h_
    }
    const TypedPtr x2 = gathered(a.ln2);
    tk::matmul_backward(dln_, g.up_w, g.up_b, dmlp_h_, x2, w.up_w, B, T, C, UPl);
    if (lora_) lora_backward(kLoraUp, dmlp_h_, UPl, x2, dln_, w.adapters, g.adapters);
  }
  reduce_rows(dln, dln_, false);
  norm_backward(dres_, g.norm2_w, g.norm2_b, dln, a.res2, w.norm2_w, a.ln2_mean, a.ln2_rstd);
  sum_norm_grads(g.norm2_w, g.norm2_b);
  // dres holds d(res2). Attention: res2 = x + proj(attn(positions(qkv(norm1(x))))).
  const TypedPtr dy = gathered(dres_);
  tk::matmul_backward(datty_, g.proj_w, g.proj_b, dy, a.atty, w.proj_w, B, T, Ql, C);
  if (lora_) lora_backward(kLoraProj, dy, C, a.atty, datty_, w.adapters, g.adapters);
  if (opt_.cp > 1) {
    DS_CHECK(hooks_->cp_attention_backward(dqkv_, datty_, a.qkv, a.atty, a.att_lse),
             "context parallelism without a cp attention hook");
  } else if (packing_) {
    tk::attention_gqa_doc_backward(dqkv_, datty_, a.qkv, a.atty, a.att_lse, mb.doc_start, att_scratch_, B, T, NHl_,
                                   KVl_, hd_);
  } else {
    tk::attention_gqa_backward(dqkv_, datty_, a.qkv, a.atty, a.att_lse, att_scratch_, B, T, NHl_, KVl_, hd_);
  }
  if (rope_) rope(dqkv_, mb, true);
  const TypedPtr x1 = gathered(a.ln1);
  tk::matmul_backward(dln_, g.qkv_w, g.qkv_b, dqkv_, x1, w.qkv_w, B, T, C, QKVl);
  if (lora_) lora_backward(kLoraQkv, dqkv_, QKVl, x1, dln_, w.adapters, g.adapters);
  reduce_rows(dln, dln_, false);
  norm_backward(dres_, g.norm1_w, g.norm1_b, dln, x, w.norm1_w, a.ln1_mean, a.ln1_rstd);
  sum_norm_grads(g.norm1_w, g.norm1_b);
  // dres holds d(x).
}

// ---- LoRA ----------------------------------------------------------------------------------------

void Decoder::init_lora_sites() {
  lora_r_ = shape_.lora.r;
  lora_scale_ = shape_.lora.scale();
  const auto all = ms::model_params(shape_);
  // Each adapted tensor's matmul and its columns in that matmul's output (this tp rank's part):
  // the fused qkv holds q, k, v (Llama: wq, wk, wv in turn), the fused up holds gate then up.
  const int q = NHl_ * hd_, kv = KVl_ * hd_;
  struct Where {
    ParamId base;
    LoraMatmul m;
    int c0;
  };
  const Where where[] = {
      {ParamId::kQkvw, kLoraQkv, 0},       {ParamId::kAttprojw, kLoraProj, 0}, {ParamId::kFcw, kLoraUp, 0},
      {ParamId::kFcprojw, kLoraDown, 0},   {ParamId::kWq, kLoraQkv, 0},        {ParamId::kWk, kLoraQkv, q},
      {ParamId::kWv, kLoraQkv, q + kv},    {ParamId::kWo, kLoraProj, 0},       {ParamId::kWgate, kLoraUp, 0},
      {ParamId::kWup, kLoraUp, Hl_},       {ParamId::kWdown, kLoraDown, 0},
  };
  for (const Where& wh : where) {
    if (!ms::lora_targets(shape_.lora, wh.base)) continue;
    const ms::ParamTensor& ta = ms::find_param(all, ms::lora_a_id(wh.base));
    const ms::ParamTensor& tb = ms::find_param(all, ms::lora_b_id(wh.base));
    LoraSite site{ta.id, tb.id};
    site.in = static_cast<int>(ms::local_shape(ta, part_.tp)[1]);
    site.out = static_cast<int>(ms::local_shape(tb, part_.tp)[0]);
    site.c0 = wh.c0;
    site.a_partial = part_.tp > 1 && tb.split != ms::TpSplit::kReplicated;
    site.full_in = ta.shape[1];
    site.col0 = ta.split == ms::TpSplit::kRow ? static_cast<int64_t>(part_.tp_rank) * site.in : 0;
    lora_sites_[wh.m].push_back(site);
  }
}

TypedPtr Decoder::lora_input(const LoraSite& s, int index, TypedPtr x) {
  if (!lora_dropout_on()) return x;
  tk::lora_dropout(lora_x_, x, static_cast<int64_t>(opt_.B) * opt_.T, s.in, s.col0, s.full_in,
                   static_cast<float>(shape_.lora.dropout), lora_key_ * 64 + static_cast<uint64_t>(index));
  return lora_x_;
}

void Decoder::lora_forward(LoraMatmul m, TypedPtr y, int ldy, TypedPtr x, TypedPtr adapters) {
  const int BT = opt_.B * opt_.T, r = lora_r_;
  for (size_t i = 0; i < lora_sites_[m].size(); ++i) {
    const LoraSite& s = lora_sites_[m][i];
    const TypedPtr A = adapters + layout_.offset_in_unit(s.a), Bw = adapters + layout_.offset_in_unit(s.b);
    const TypedPtr xin = lora_input(s, m * 8 + static_cast<int>(i), x);
    tk::matmul_forward(lora_t_, xin, A, TypedPtr(), 1, BT, s.in, r);          // t = drop(x) A^T  (BT, r)
    tk::matmul_forward(lora_u_, lora_t_, Bw, TypedPtr(), 1, BT, r, s.out);    // u = t B^T  (BT, out)
    tk::columns_axpy(y + s.c0, ldy, lora_u_, s.out, lora_scale_, BT, s.out, true);
  }
}

void Decoder::lora_backward(LoraMatmul m, TypedPtr dy, int ldy, TypedPtr x, TypedPtr dx, TypedPtr adapters,
                            TypedPtr grads) {
  const int BT = opt_.B * opt_.T, r = lora_r_;
  for (size_t i = 0; i < lora_sites_[m].size(); ++i) {
    const LoraSite& s = lora_sites_[m][i];
    const TypedPtr A = adapters + layout_.offset_in_unit(s.a), Bw = adapters + layout_.offset_in_unit(s.b);
    const TypedPtr gA = grads + layout_.offset_in_unit(s.a), gB = grads + layout_.offset_in_unit(s.b);
    const int index = m * 8 + static_cast<int>(i);
    const TypedPtr xin = lora_input(s, index, x);                                      // the forward's masks
    tk::columns_axpy(lora_u_, s.out, dy + s.c0, ldy, lora_scale_, BT, s.out, false);  // du = scale dy
    tk::matmul_forward(lora_t_, xin, A, TypedPtr(), 1, BT, s.in, r);                   // t again
    tk::matmul_backward(lora_dt_, gB, TypedPtr(), lora_u_, lora_t_, Bw, 1, BT, r, s.out);  // dt; dB += du^T t
    tk::matmul_backward(lora_dx_, gA, TypedPtr(), lora_dt_, xin, A, 1, BT, s.in, r);   // dx share; dA += dt^T x
    if (lora_dropout_on()) {  // through the dropout: the same mask and scale
      tk::lora_dropout(lora_dx_, lora_dx_, BT, s.in, s.col0, s.full_in, static_cast<float>(shape_.lora.dropout),
                       lora_key_ * 64 + static_cast<uint64_t>(index));
    }
    tk::add_in_place(dx, lora_dx_, static_cast<int64_t>(BT) * s.in);
    // The replicated factor's gradient came from this rank's part of the sum: the tp group adds them.
    if (s.a_partial) hooks_->tp_sum_partial_grads(gA, static_cast<int64_t>(r) * s.in);
    if (part_.tp > 1 && !s.a_partial) hooks_->tp_sum_partial_grads(gB, static_cast<int64_t>(s.out) * r);
  }
}

// ---- mixture of experts --------------------------------------------------------------------------

const std::vector<int32_t>& Decoder::route(const DecoderLayerActs& a) {
  const int64_t NK = static_cast<int64_t>(opt_.B) * opt_.T * k_;
  kern::moe_sort_slots(moe_slots_, moe_pos_, moe_offsets_, a.topk_idx, NK, E_);
  kern::copy_to_host(moe_offsets_host_.data(), moe_offsets_, moe_offsets_host_.size() * sizeof(int32_t));
  return moe_offsets_host_;
}

const std::vector<int32_t>& Decoder::router_forward(DecoderLayerActs& a, TypedPtr x, const DecoderLayerWeights& w,
                                                    RouterStats* stats) {
  const int N = opt_.B * opt_.T;
  tk::matmul_forward(router_logits_, x, w.router_w, TypedPtr(), 1, N, C_, E_);
  tk::moe_router_forward(a.router_probs, a.topk_idx, a.topk_w, moe_daux_, router_logits_, N, E_, k_);
  const std::vector<int32_t>& off = route(a);
  if (stats != nullptr) {
    kern::copy_to_host(moe_host_e_.data(), moe_daux_, moe_host_e_.size() * sizeof(float));
    for (int e = 0; e < E_; e++) {
      stats->counts[static_cast<size_t>(e)] += off[static_cast<size_t>(e) + 1] - off[static_cast<size_t>(e)];
      stats->prob_sums[static_cast<size_t>(e)] += moe_host_e_[static_cast<size_t>(e)];
    }
    stats->rows += N;
  }
  return off;
}

void Decoder::moe_forward(DecoderLayerActs& a, TypedPtr x, const DecoderLayerWeights& w, TypedPtr y, bool full,
                          RouterStats* stats) {
  if (ep_ > 1) return moe_forward_ep(a, x, w, y, full, stats);
  const int C = C_, Il = Hl_, N = opt_.B * opt_.T;
  const int64_t NK = static_cast<int64_t>(N) * k_;
  const cpu::VariableMatmulRows rows_vary;  // the experts' row counts change every call (CPU matmuls)
  const std::vector<int32_t>& off = router_forward(a, x, w, stats);
  tk::moe_gather_rows(moe_xs_, x, moe_slots_, nullptr, NK, k_, C);
  for_each_expert(off, E_, [&](int e, int64_t r0, int n) {
    tk::matmul_forward(a.mlp_h + r0 * 2 * Il, moe_xs_ + r0 * C, w.up_w + static_cast<int64_t>(e) * 2 * Il * C,
                       TypedPtr(), 1, n, C, 2 * Il);
  });
  tk::swiglu_forward(a.mlp_act, a.mlp_h, NK, Il);
  if (!full) return;
  for_each_expert(off, E_, [&](int e, int64_t r0, int n) {
    tk::matmul_forward(moe_ys_ + r0 * C, a.mlp_act + r0 * Il, w.down_w + static_cast<int64_t>(e) * C * Il, TypedPtr(),
                       1, n, Il, C);
  });
  tk::moe_combine(y, moe_ys_, moe_pos_, a.topk_w, N, k_, C);
}

void Decoder::moe_backward(DecoderLayerActs& a, TypedPtr ln2, TypedPtr dy, const DecoderLayerWeights& w,
                           const DecoderLayerWeights& g, const RouterStats& stats, float grad_scale) {
  if (ep_ > 1) return moe_backward_ep(a, ln2, dy, w, g, stats, grad_scale);
  const int C = C_, Il = Hl_, N = opt_.B * opt_.T;
  const int64_t NK = static_cast<int64_t>(N) * k_;
  const cpu::VariableMatmulRows rows_vary;
  const std::vector<int32_t>& off = route(a);
  // d(out) of each slot in expert order: unweighted (moe_ys_) and weighted by the slot's routing
  // weight (moe_xs_, until the slots' inputs are gathered again below).
  tk::moe_gather_rows(moe_ys_, dy, moe_slots_, nullptr, NK, k_, C);
  tk::moe_gather_rows(moe_xs_, dy, moe_slots_, a.topk_w, NK, k_, C);
  for_each_expert(off, E_, [&](int e, int64_t r0, int n) {
    const TypedPtr w2 = w.down_w + static_cast<int64_t>(e) * C * Il;
    // G = dY @ w2 (the activation's gradient before the weight); w2's gradient from the weighted dY.
    tk::matmul_backward(dmlp_act_ + r0 * Il, nullptr, nullptr, moe_ys_ + r0 * C, a.mlp_act + r0 * Il, w2, 1, n, Il,
                        C);
    tk::matmul_backward(nullptr, g.down_w + static_cast<int64_t>(e) * C * Il, nullptr, moe_xs_ + r0 * C,
                        a.mlp_act + r0 * Il, w2, 1, n, Il, C);
  });
  // d(routing weight) of each slot = <G, act> (summed over tp: act is this rank's columns).
  tk::moe_slot_dots(moe_dw_, dmlp_act_, a.mlp_act, moe_pos_, NK, Il);
  if (part_.tp > 1) hooks_->tp_loss_reduce_sum(moe_dw_, NK);
  tk::moe_scale_rows(dmlp_act_, moe_slots_, a.topk_w, NK, Il);
  tk::swiglu_backward(dmlp_h_, dmlp_act_, a.mlp_h, NK, Il);
  const TypedPtr x = gathered(ln2);
  tk::moe_gather_rows(moe_xs_, x, moe_slots_, nullptr, NK, k_, C);
  for_each_expert(off, E_, [&](int e, int64_t r0, int n) {
    const int64_t w13 = static_cast<int64_t>(e) * 2 * Il * C;
    tk::matmul_backward(moe_ys_ + r0 * C, g.up_w + w13, nullptr, dmlp_h_ + r0 * 2 * Il, moe_xs_ + r0 * C, w.up_w + w13,
                        1, n, C, 2 * Il);
  });
  tk::moe_combine(dln_, moe_ys_, moe_pos_, nullptr, N, k_, C);
  router_backward(a, x, w, g, stats, grad_scale);
}

void Decoder::router_backward(DecoderLayerActs& a, TypedPtr x, const DecoderLayerWeights& w,
                              const DecoderLayerWeights& g, const RouterStats& stats, float grad_scale) {
  const int C = C_, N = opt_.B * opt_.T;
  // The load-balancing loss's gradient on every row's probabilities, then the softmax's.
  const float coef = static_cast<float>(shape_.router_aux_loss_coef);
  const float* daux = nullptr;
  if (coef != 0.0f && stats.rows > 0) {
    const double scale = coef * static_cast<double>(grad_scale) * E_ / (stats.rows * stats.rows);
    for (int e = 0; e < E_; e++) moe_host_e_[static_cast<size_t>(e)] = static_cast<float>(scale * stats.counts[static_cast<size_t>(e)]);
    kern::copy_from_host(moe_daux_, moe_host_e_.data(), moe_host_e_.size() * sizeof(float));
    daux = moe_daux_;
  }
  tk::moe_router_backward(router_logits_, a.router_probs, a.topk_idx, a.topk_w, moe_dw_, daux, N, E_, k_);
  // d x from the router, added once over the tp group (every rank computed the same).
  tk::matmul_backward(part_.tp_rank == 0 ? moe_xs_ : TypedPtr(), g.router_w, nullptr, router_logits_, x, w.router_w, 1,
                      N, C, E_);
  if (part_.tp_rank == 0) tk::add_in_place(dln_, moe_xs_, static_cast<int64_t>(N) * C);
}

// ---- expert parallelism ---------------------------------------------------------------------------

std::vector<int32_t> Decoder::ep_counts(DecoderLayerActs& la, const std::vector<int32_t>& off) {
  // Rank q gets the counts of its experts [q El, (q+1) El): this rank's slots of each.
  std::vector<int32_t> mine(static_cast<size_t>(E_));
  for (int e = 0; e < E_; e++) mine[static_cast<size_t>(e)] = off[static_cast<size_t>(e) + 1] - off[static_cast<size_t>(e)];
  kern::copy_from_host(moe_cnt_send_, mine.data(), mine.size() * sizeof(int32_t));
  const std::vector<int64_t> each(static_cast<size_t>(ep_), El_);
  DS_CHECK(hooks_->ep_all_to_all(moe_cnt_send_, each, la.moe_ep_counts, each, sizeof(int32_t)),
           "expert parallelism without an ep all-to-all hook");
  std::vector<int32_t> got(static_cast<size_t>(E_));
  kern::copy_to_host(got.data(), la.moe_ep_counts, got.size() * sizeof(int32_t));
  return got;
}

Decoder::EpExchange Decoder::ep_exchange(const std::vector<int32_t>& off, const std::vector<int32_t>& recv_counts) {
  EpExchange x;
  x.send_rows.resize(static_cast<size_t>(ep_));
  x.recv_rows.assign(static_cast<size_t>(ep_), 0);
  for (int q = 0; q < ep_; q++) {
    x.send_rows[static_cast<size_t>(q)] = off[static_cast<size_t>((q + 1) * El_)] - off[static_cast<size_t>(q * El_)];
    for (int j = 0; j < El_; j++) x.recv_rows[static_cast<size_t>(q)] += recv_counts[static_cast<size_t>(q * El_ + j)];
  }
  // Source order: rank q's rows, each rank's sorted by local expert. Expert order: expert j's
  // rows, each expert's by source rank.
  std::vector<int64_t> src_off(static_cast<size_t>(ep_) + 1, 0);
  for (int q = 0; q < ep_; q++) src_off[static_cast<size_t>(q) + 1] = src_off[static_cast<size_t>(q)] + x.recv_rows[static_cast<size_t>(q)];
  x.rows = src_off.back();
  DS_CHECK(x.rows <= Rmax_, "expert parallelism: {} rows received, more than the {} the buffers hold", x.rows, Rmax_);
  x.expert_off.assign(static_cast<size_t>(El_) + 1, 0);
  std::vector<int32_t> to_expert(static_cast<size_t>(x.rows)), to_source(static_cast<size_t>(x.rows));
  int64_t at = 0;
  for (int j = 0; j < El_; j++) {
    for (int q = 0; q < ep_; q++) {
      int64_t within = 0;  // rank q's rows for local experts before j
      for (int i = 0; i < j; i++) within += recv_counts[static_cast<size_t>(q * El_ + i)];
      const int64_t from = src_off[static_cast<size_t>(q)] + within;
      for (int32_t r = 0; r < recv_counts[static_cast<size_t>(q * El_ + j)]; r++, at++) {
        to_expert[static_cast<size_t>(at)] = static_cast<int32_t>(from + r);
        to_source[static_cast<size_t>(from + r)] = static_cast<int32_t>(at);
      }
    }
    x.expert_off[static_cast<size_t>(j) + 1] = static_cast<int32_t>(at);
  }
  kern::copy_from_host(moe_perm_, to_expert.data(), to_expert.size() * sizeof(int32_t));
  kern::copy_from_host(moe_perm_ + Rmax_, to_source.data(), to_source.size() * sizeof(int32_t));
  return x;
}

void Decoder::moe_forward_ep(DecoderLayerActs& a, TypedPtr x, const DecoderLayerWeights& w, TypedPtr y, bool full,
                             RouterStats* stats) {
  const int C = C_, Il = Hl_, N = opt_.B * opt_.T;
  const int64_t NK = static_cast<int64_t>(N) * k_;
  const size_t row_bytes = static_cast<size_t>(C) * dtype_size(opt_.dtype);
  const cpu::VariableMatmulRows rows_vary;
  const std::vector<int32_t> off = router_forward(a, x, w, stats);
  tk::moe_gather_rows(moe_xs_, x, moe_slots_, nullptr, NK, k_, C);
  const EpExchange ex = ep_exchange(off, ep_counts(a, off));
  // The rows to their experts' ranks, then into expert order.
  DS_CHECK(hooks_->ep_all_to_all(moe_xs_.data, ex.send_rows, moe_recv_.data, ex.recv_rows, row_bytes),
           "expert parallelism without an ep all-to-all hook");
  tk::moe_gather_rows(a.moe_ex_x, moe_recv_, moe_perm_, nullptr, ex.rows, 1, C);
  for_each_expert(ex.expert_off, El_, [&](int j, int64_t r0, int n) {
    tk::matmul_forward(a.mlp_h + r0 * 2 * Il, a.moe_ex_x + r0 * C, w.up_w + static_cast<int64_t>(j) * 2 * Il * C,
                       TypedPtr(), 1, n, C, 2 * Il);
  });
  tk::swiglu_forward(a.mlp_act, a.mlp_h, ex.rows, Il);
  if (!full) return;
  for_each_expert(ex.expert_off, El_, [&](int j, int64_t r0, int n) {
    tk::matmul_forward(moe_ys_ + r0 * C, a.mlp_act + r0 * Il, w.down_w + static_cast<int64_t>(j) * C * Il, TypedPtr(),
                       1, n, Il, C);
  });
  // The outputs back into source order and to their tokens' ranks, then combined.
  tk::moe_gather_rows(moe_recv_, moe_ys_, moe_perm_ + Rmax_, nullptr, ex.rows, 1, C);
  DS_CHECK(hooks_->ep_all_to_all(moe_recv_.data, ex.recv_rows, moe_xs_.data, ex.send_rows, row_bytes),
           "expert parallelism without an ep all-to-all hook");
  tk::moe_combine(y, moe_xs_, moe_pos_, a.topk_w, N, k_, C);
}

void Decoder::moe_backward_ep(DecoderLayerActs& a, TypedPtr ln2, TypedPtr dy, const DecoderLayerWeights& w,
                              const DecoderLayerWeights& g, const RouterStats& stats, float grad_scale) {
  const int C = C_, Il = Hl_, N = opt_.B * opt_.T;
  const int64_t NK = static_cast<int64_t>(N) * k_;
  const size_t row_bytes = static_cast<size_t>(C) * dtype_size(opt_.dtype);
  const cpu::VariableMatmulRows rows_vary;
  const std::vector<int32_t> off = route(a);
  std::vector<int32_t> counts(static_cast<size_t>(E_));
  kern::copy_to_host(counts.data(), a.moe_ep_counts, counts.size() * sizeof(int32_t));
  const EpExchange ex = ep_exchange(off, counts);
  const int64_t R = ex.rows;
  float* f_src = moe_fbuf_;                                        // R floats in source order
  float* f_tok = moe_fbuf_ + std::max<int64_t>(NK, Rmax_);          // NK floats in token order
  // d(out) of each slot and its routing weight, to the experts' ranks, into expert order.
  tk::moe_gather_rows(moe_xs_, dy, moe_slots_, nullptr, NK, k_, C);
  DS_CHECK(hooks_->ep_all_to_all(moe_xs_.data, ex.send_rows, moe_recv_.data, ex.recv_rows, row_bytes),
           "expert parallelism without an ep all-to-all hook");
  tk::moe_gather_rows(moe_ys_, moe_recv_, moe_perm_, nullptr, R, 1, C);  // dY, expert order
  kern::moe_gather_f32(f_tok, a.topk_w, moe_slots_, NK);                 // the weights, sorted
  DS_CHECK(hooks_->ep_all_to_all(f_tok, ex.send_rows, f_src, ex.recv_rows, sizeof(float)),
           "expert parallelism without an ep all-to-all hook");
  kern::moe_gather_f32(moe_ex_w_, f_src, moe_perm_, R);
  // The experts: G = dY w2, the weights' gradients <G, act>, w2's from the weighted dY, w G the
  // activation's gradient, then SwiGLU and w13.
  tk::moe_gather_rows(moe_recv_, moe_ys_, nullptr, moe_ex_w_, R, 1, C);  // weighted dY
  for_each_expert(ex.expert_off, El_, [&](int j, int64_t r0, int n) {
    const TypedPtr w2 = w.down_w + static_cast<int64_t>(j) * C * Il;
    tk::matmul_backward(dmlp_act_ + r0 * Il, nullptr, nullptr, moe_ys_ + r0 * C, a.mlp_act + r0 * Il, w2, 1, n, Il, C);
    tk::matmul_backward(nullptr, g.down_w + static_cast<int64_t>(j) * C * Il, nullptr, moe_recv_ + r0 * C,
                        a.mlp_act + r0 * Il, w2, 1, n, Il, C);
  });
  tk::moe_slot_dots(moe_dw_, dmlp_act_, a.mlp_act, nullptr, R, Il);
  if (part_.tp > 1) hooks_->tp_loss_reduce_sum(moe_dw_, R);
  tk::moe_scale_rows(dmlp_act_, nullptr, moe_ex_w_, R, Il);
  tk::swiglu_backward(dmlp_h_, dmlp_act_, a.mlp_h, R, Il);
  for_each_expert(ex.expert_off, El_, [&](int j, int64_t r0, int n) {
    const int64_t w13 = static_cast<int64_t>(j) * 2 * Il * C;
    tk::matmul_backward(moe_ys_ + r0 * C, g.up_w + w13, nullptr, dmlp_h_ + r0 * 2 * Il, a.moe_ex_x + r0 * C,
                        w.up_w + w13, 1, n, C, 2 * Il);
  });
  // The weights' gradients and the inputs' gradients back to the tokens' ranks.
  kern::moe_gather_f32(f_src, moe_dw_, moe_perm_ + Rmax_, R);
  DS_CHECK(hooks_->ep_all_to_all(f_src, ex.recv_rows, f_tok, ex.send_rows, sizeof(float)),
           "expert parallelism without an ep all-to-all hook");
  kern::moe_gather_f32(moe_dw_, f_tok, moe_pos_, NK);  // slot order
  tk::moe_gather_rows(moe_recv_, moe_ys_, moe_perm_ + Rmax_, nullptr, R, 1, C);
  DS_CHECK(hooks_->ep_all_to_all(moe_recv_.data, ex.recv_rows, moe_xs_.data, ex.send_rows, row_bytes),
           "expert parallelism without an ep all-to-all hook");
  tk::moe_combine(dln_, moe_xs_, moe_pos_, nullptr, N, k_, C);
  router_backward(a, gathered(ln2), w, g, stats, grad_scale);
}

void Decoder::blocks_forward(DecoderActivations& a, int l0, int l1) {
  check_layers(l0, l1, "blocks_forward");
  kern::DeviceScope scope(opt_.device, opt_.cuda_stream);
  for (int l = l0; l < l1; l++) {
    const Unit u{UnitKind::kLayer, l}, ue{UnitKind::kExperts, l}, ua{UnitKind::kAdapters, l};
    const TypedPtr pu = unit_params(u);
    DecoderLayerWeights w = layer_weights(pu, moe_ ? unit_params(ue) : TypedPtr());
    if (lora_) {
      w.adapters = unit_params(ua);
      if (l == part_.layer_begin) a.lora_key = ++lora_mb_count_;  // a new micro-batch's masks
      lora_key_ = a.lora_key * 4096 + static_cast<uint64_t>(l);
    }
    layer_forward(a.layers[static_cast<size_t>(l - part_.layer_begin)], layer_input(a, l), w, true,
                  moe_ ? &a.router : nullptr, a);
    progress::bump();  // comm/beacon.h: a slow step is not a hang
    if (lora_) params_done(ua);
    if (moe_) params_done(ue);
    params_done(u);
  }
}

void Decoder::blocks_backward(DecoderActivations& a, int l0, int l1) {
  check_layers(l0, l1, "blocks_backward");
  kern::DeviceScope scope(opt_.device, opt_.cuda_stream);
  for (int l = l1 - 1; l >= l0; l--) {
    const Unit u{UnitKind::kLayer, l}, ue{UnitKind::kExperts, l}, ua{UnitKind::kAdapters, l};
    const TypedPtr pu = unit_params(u);
    DecoderLayerWeights w = layer_weights(pu, moe_ ? unit_params(ue) : TypedPtr());
    const TypedPtr gu = unit_grads(u);
    DecoderLayerWeights g = layer_weights(gu, moe_ ? unit_grads(ue) : TypedPtr());
    if (lora_) {
      w.adapters = unit_params(ua);
      g.adapters = unit_grads(ua);
      lora_key_ = a.lora_key * 4096 + static_cast<uint64_t>(l);  // the forward's masks
    }
    DecoderLayerActs& la = a.layers[static_cast<size_t>(l - part_.layer_begin)];
    const TypedPtr x = layer_input(a, l);
    if (opt_.recompute) layer_forward(la, x, w, false, nullptr, a);
    layer_backward(la, x, w, g, a);  // dres: d(out) -> d(x)
    if (lora_) params_done(ua);
    if (moe_) params_done(ue);
    params_done(u);
    if (lora_) grads_ready(ua);
    if (moe_) grads_ready(ue);
    grads_ready(u);
    progress::bump();
  }
}

// ---- head: final norm, lm_head (or the tied embedding), loss -------------------------------------

void Decoder::head_chunks(DecoderActivations& a, const int32_t* targets, TypedPtr w, TypedPtr gw, bool backward,
                          float dloss, const int32_t* host_targets) {
  const int C = C_, BT = opt_.B * opt_.T, V = shape_.vocab_size, Vp = Vp_l_;
  int64_t bad = 0;
  for (int r0 = 0; r0 < BT; r0 += head_rows_) {
    const int rows = std::min(head_rows_, BT - r0);
    const TypedPtr xin = (sp_ ? sp_gather_ : a.lnf) + static_cast<int64_t>(r0) * C;
    const TypedPtr dx = dln_ + static_cast<int64_t>(r0) * C;
    tk::matmul_forward(logits_, xin, w, TypedPtr(), 1, rows, C, Vp);
    if (part_.tp > 1) {
      // Vocabulary-parallel loss: global row max, then global sums, then losses and dlogits.
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
        // Sequence parallelism reduce-scatters all rows' dx after the last chunk instead.
        if (!sp_) hooks_->tp_reduce_backward(dx, static_cast<int64_t>(rows) * C);
      }
    } else if (backward) {
      bad += tk::crossentropy_softmax_backward(a.losses + r0, logits_, targets + r0, dloss, rows, V, Vp);
      tk::matmul_backward(dx, gw, TypedPtr(), logits_, xin, w, 1, rows, C, Vp);
    } else {
      bad += tk::crossentropy_forward(a.losses + r0, logits_, targets + r0, rows, V, Vp);
    }
    if (a.record_top && !backward) record_top_rows(a, host_targets, r0, rows);
  }
  DS_CHECK(bad == 0, "targets were validated");
}

void Decoder::record_top_rows(DecoderActivations& a, const int32_t* host_targets, int r0, int rows) {
  const int V = shape_.vocab_size, Vp = Vp_l_;
  uint8_t* top = a.target_is_top.data() + r0;
  if (part_.tp > 1) {  // the reduced row maxima and target logits of the vocabulary-parallel loss
    std::vector<float> st(3 * static_cast<size_t>(rows));
    kern::copy_to_host(st.data(), ce_stats_, st.size() * sizeof(float));
    for (int r = 0; r < rows; r++) top[r] = host_targets[r0 + r] < 0 || st[2 * rows + r] >= st[r] ? 1 : 0;
    return;
  }
  std::vector<float> row(static_cast<size_t>(V));
  for (int r = 0; r < rows; r++) {
    const int32_t t = host_targets[r0 + r];
    if (t < 0) {
      top[r] = 1;
      continue;
    }
    kern::typed::to_host_f32(row.data(), logits_ + static_cast<int64_t>(r) * Vp, V);
    top[r] = *std::max_element(row.begin(), row.end()) <= row[static_cast<size_t>(t)] ? 1 : 0;
  }
}

namespace {
// The sum of n per-token losses on the host, in double, in order: what the head's mean is made of.
double host_loss_sum(const float* losses, int n) {
  double sum = 0.0;
  for (int i = 0; i < n; i++) sum += losses[i];
  return sum;
}
}  // namespace

float Decoder::head(DecoderActivations& a, const int32_t* targets, bool backward, float grad_scale, HeadLoss loss) {
  if (!part_.has_head) throw invalid_usage("head on a part without the head");
  check_tokens(targets, "target", true);
  kern::DeviceScope scope(opt_.device, opt_.cuda_stream);
  const int32_t* host_targets = targets;
  targets = ids_for_kernels(targets, 1);
  const int BT = opt_.B * opt_.T;
  const bool tied = shape_.tied();
  const ms::LayerRoles& r = family_.roles;
  const Unit wte{UnitKind::kTokenEmbedding}, lnf{UnitKind::kFinalNorm};
  // The units in order: the (tied) embedding, then the final norm.
  const TypedPtr pte = tied ? unit_params(wte) : TypedPtr();
  const TypedPtr pf = unit_params(lnf);
  const TypedPtr normw = pf + layout_.offset_in_unit(r.final_norm_w);
  const TypedPtr normb = r.final_norm_b ? pf + layout_.offset_in_unit(*r.final_norm_b) : TypedPtr();
  const TypedPtr w = tied ? pte : pf + layout_.offset_in_unit(ParamId::kLmHead);
  const TypedPtr x = output(a);
  norm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, x, normw, normb);
  if (sp_) gathered(a.lnf);  // the head reads every row (head_chunks: sp_gather_)
  TypedPtr gw, gf;
  if (backward && tied) gw = unit_grads(wte);
  if (backward) gf = unit_grads(lnf);
  if (backward && !tied) gw = gf + layout_.offset_in_unit(ParamId::kLmHead);
  if (backward) a.grad_scale = grad_scale;
  // Each counted token's dloss: grad_scale / (B*T), or / loss_divisor_ with loss masks (model.h).
  const float divisor = loss_divisor_ > 0 ? static_cast<float>(loss_divisor_) : static_cast<float>(BT);
  if (a.record_top && !backward) a.target_is_top.assign(static_cast<size_t>(BT), 1);
  head_chunks(a, targets, w, gw, backward, grad_scale / divisor, host_targets);
  if (backward) {
    if (sp_) reduce_rows(dln_sp_, dln_, false);
    tk::fill_zero(dres_, Rl_ * C_);
    const TypedPtr gnw = gf + layout_.offset_in_unit(r.final_norm_w);
    const TypedPtr gnb = r.final_norm_b ? gf + layout_.offset_in_unit(*r.final_norm_b) : TypedPtr();
    norm_backward(dres_, gnw, gnb, sp_ ? dln_sp_ : dln_, x, normw, a.lnf_mean, a.lnf_rstd);
    sum_norm_grads(gnw, gnb);
    grads_ready(lnf);
    if (tied && !part_.has_embedding) grads_ready(wte);
  }
  if (tied) params_done(wte);
  params_done(lnf);
  if (loss == HeadLoss::kKeep) {
    if (opt_.device == Device::kCuda) {
      if (kept_on_device_ == cuda::kLossSlots) bring_back_kept_losses();
      kern::loss_sum_to_slot(a.losses, BT, kept_on_device_++);
    } else {
      kept_loss_sums_.push_back(host_loss_sum(a.losses, BT));  // the bits head returns, below
    }
    return 0.0f;
  }
  // The per-token losses, on the host (on CUDA a copy back: the one synchronisation per micro-batch).
  const float* losses = a.losses;
  std::vector<float> device_losses;
  std::vector<float>& host_losses = a.record_top && !backward ? a.host_losses : device_losses;
  if (opt_.device == Device::kCuda || &host_losses == &a.host_losses) {
    host_losses.resize(static_cast<size_t>(BT));
    kern::copy_to_host(host_losses.data(), a.losses, host_losses.size() * sizeof(float));
    losses = host_losses.data();
  }
  return static_cast<float>(host_loss_sum(losses, BT) / BT);
}

float Decoder::head_forward(DecoderActivations& a, const int32_t* targets) { return head(a, targets, false, 0.0f); }

float Decoder::head_forward_backward(DecoderActivations& a, const int32_t* targets, float grad_scale) {
  return head(a, targets, true, grad_scale);
}

void Decoder::head_forward_backward_deferred(DecoderActivations& a, const int32_t* targets, float grad_scale) {
  head(a, targets, true, grad_scale, HeadLoss::kKeep);
}

// The device's slots after the host's sums (they were kept later), in one copy.
void Decoder::bring_back_kept_losses() {
  if (kept_on_device_ == 0) return;
  kern::DeviceScope scope(opt_.device, opt_.cuda_stream);
  const size_t n0 = kept_loss_sums_.size();
  kept_loss_sums_.resize(n0 + static_cast<size_t>(kept_on_device_));
  kern::loss_slots_to_host(kept_loss_sums_.data() + n0, kept_on_device_);
  kept_on_device_ = 0;
}

std::vector<float> Decoder::take_losses() {
  bring_back_kept_losses();
  const double BT = static_cast<double>(opt_.B) * opt_.T;
  std::vector<float> means;
  means.reserve(kept_loss_sums_.size());
  for (double sum : kept_loss_sums_) means.push_back(static_cast<float>(sum / BT));
  kept_loss_sums_.clear();
  return means;
}

void Decoder::drop_kept_losses() {
  kept_loss_sums_.clear();
  kept_on_device_ = 0;
}

void Decoder::keep_replayed_losses(int n) {
  DS_CHECK(opt_.device == Device::kCuda && kept_on_device_ == 0 && kept_loss_sums_.empty() && n >= 0 &&
               n <= cuda::kLossSlots,
           "replayed losses: {} of them on a device with {} kept already (of {} slots)", n, kept_on_device_,
           cuda::kLossSlots);
  kept_on_device_ = n;
}

}  // namespace ds::rt
