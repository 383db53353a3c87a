// The optimizers beside AdamW (optimizer_state.h): Lamb, Adagrad, Lion, and the 1-bit ones,
// OneBitAdam, ZeroOneAdam and OneBitLamb, over this rank's range on the CPU. Each follows its
// DeepSpeed class (docs/configuration.md "Optimizers" names them and where dstrain differs):
//   Lamb (FusedLamb)   m, v as Adam's; u = m / (sqrt(v) + eps) + wd p (no bias correction in u);
//                      ratio = ||p|| / ||u|| per tensor, clamped to [min_coeff, max_coeff] (1 when
//                      either norm is 0); p -= lr sqrt(1 - b2^t) / (1 - b1^t) ratio u.
//   Adagrad            g += wd p; v += g^2; p -= lr g / (sqrt(v) + eps).
//   Lion               p *= 1 - lr wd; p -= lr sign(b1 m + (1 - b1) g); m = b2 m + (1 - b2) g.
//   OneBitAdam         t <= freeze_step: Adam without bias correction on the all-reduced gradients,
//                      u = m / (sqrt(v) + eps) + wd p, p -= lr u. After: v frozen, local gradients,
//                      m = b1 m + (1 - b1) g, then m = the 1-bit all-reduce of m.
//   ZeroOneAdam        before var_freeze_step: the variance (and the all-reduce of full gradients)
//                      only at steps that are multiples of var_interval, which doubles every
//                      var_update_scaler updates; between them the gradient travels 1-bit. After:
//                      local steps, synchronised every local_step_interval steps (doubling every
//                      local_step_scaler steps up to local_step_clipper) by a 1-bit all-reduce of
//                      the accumulated update; v frozen.
//   OneBitLamb         t <= freeze_step: LAMB without bias correction, the trust ratios' moving
//                      average (coeff_beta) kept; at freeze_step v is copied as v_fresh. After:
//                      local momentum scaled per tensor to a common RMS, 1-bit all-reduced and
//                      unscaled; v_fresh tracks the gradient reconstructed from the momenta; the
//                      ratio is the frozen average times a factor max((sqrt(v)+eps)/(sqrt(v_fresh)+eps)),
//                      bounded by factor_min/max and within factor_threshold of the last one.
// "Per tensor" is per tensor of the whole model: every rank adds the squares of the pieces it
// counts (norm_ranges: each element once in the world) to a vector indexed by (layer, tensor),
// summed over the host world in rank order.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/optimizer_passes.h"
#include "layout/partition.h"
#include "train/optimizer_state.h"

namespace ds::rt::train {

namespace ms = ds::model_spec;

namespace {

// Calls f(const G*) with the gradients' element type.
template <typename F>
void with_grads(TypedPtr g, F&& f) {
  switch (g.dtype) {
    case DType::kF32: return f(static_cast<const float*>(g.data));
    case DType::kBF16: return f(static_cast<const bf16*>(g.data));
    case DType::kF16: return f(static_cast<const f16*>(g.data));
  }
}

double clamp_ratio(double w_sq, double u_sq, double lo, double hi) {
  if (!(w_sq > 0) || !(u_sq > 0)) return 1.0;
  return std::clamp(std::sqrt(w_sq) / std::sqrt(u_sq), lo, hi);
}

}  // namespace

void OptimizerState::build_segments(const ms::ModelShape& shape) {
  const auto all = ms::model_params(shape);
  num_tensors_ = (shape.n_layer + 1) * ms::kNumParamTensors;
  const int64_t ob = opt_begin(), oe = ob + opt_count();
  for (const auto& t : model_.layout().tensors) {
    const auto r = layout::intersect(ob, oe, t.offset - region_, t.offset - region_ + t.numel);
    if (r.size() <= 0) continue;
    const int index = (t.layer + 1) * ms::kNumParamTensors + static_cast<int>(t.id);
    const bool decay = ms::find_param(all, t.id).shape.size() == 2;
    // Split the piece where the counted ranges begin and end.
    int64_t at = r.lo - ob;
    const int64_t end = r.lo - ob + r.size();
    while (at < end) {
      bool counted = false;
      int64_t next = end;
      for (const auto& [off, n] : norm_ranges_) {
        if (off <= at && at < off + n) {
          counted = true;
          next = std::min(end, off + n);
          break;
        }
        if (off > at) next = std::min(next, off);
      }
      segments_.push_back({at, next - at, index, counted, decay});
      at = next;
    }
  }
  const size_t nt = static_cast<size_t>(num_tensors_);
  lamb_coeff_freeze_.assign(nt, 0.0);
  last_factor_.assign(nt, 1.0);
}

std::vector<double> OptimizerState::world_sum(const std::vector<double>& v) {
  return world_ ? world_->sum_in_rank_order(v) : v;
}

std::vector<double> OptimizerState::world_max(const std::vector<double>& v) {
  if (!world_) return v;
  // Non-negative doubles order as their bit patterns do.
  std::vector<int64_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) std::memcpy(&bits[i], &v[i], 8);
  const std::vector<int64_t> all = world_->gather_int64(bits);
  std::vector<double> out(v.size(), 0.0);
  for (size_t r = 0; r * v.size() < all.size(); ++r) {
    for (size_t i = 0; i < v.size(); ++i) {
      double x;
      std::memcpy(&x, &all[r * v.size() + i], 8);
      out[i] = std::max(out[i], x);
    }
  }
  return out;
}

bool OptimizerState::begin_step() {
  const int64_t t = adam_steps_ + 1;
  const bool multi = zero_.dp_size() > 1;
  const std::string& type = opt_.type;
  if (type == "OneBitAdam" || type == "OneBitLamb") {
    frozen_ = t > opt_.freeze_step;
    local_ = frozen_ && multi;
  } else if (type == "ZeroOneAdam") {
    full_step_ = !frozen_ && t % var_interval_ == 0;
    local_ = multi && !full_step_;
  } else {
    local_ = false;
  }
  zero_.set_local_gradients(local_);
  return local_;
}

void OptimizerState::update_other(double lr, double gs, TypedPtr grads) {
  const std::string& type = opt_.type;
  float* p = master_params();
  const float flr = static_cast<float>(lr), fgs = static_cast<float>(gs);
  if (type == "Lion" || type == "Adagrad") {
    with_grads(grads, [&](auto* g) {
      cpu::for_each_decay_run(opt_begin(), opt_count(), decay_, [&](int64_t o, int64_t n, bool d) {
        if (type == "Lion") {
          const float df = d ? static_cast<float>(1.0 - lr * opt_.weight_decay) : 1.0f;
          cpu::lion_update(p + o, g + o, exp_avg() + o, n, flr, static_cast<float>(opt_.beta1),
                           static_cast<float>(opt_.beta2), df, fgs);
        } else {
          cpu::adagrad_update(p + o, g + o, exp_avg_sq() + o, n, flr, static_cast<float>(opt_.eps),
                              d ? static_cast<float>(opt_.weight_decay) : 0.0f, fgs);
        }
      });
    });
  } else if (type == "Lamb") {
    update_lamb(lr, gs, grads);
  } else if (type == "OneBitAdam") {
    update_onebit_adam(lr, gs, grads);
  } else if (type == "ZeroOneAdam") {
    update_zero_one_adam(lr, gs, grads);
  } else if (type == "OneBitLamb") {
    update_onebit_lamb(lr, gs, grads);
  } else {
    throw invalid_usage("OptimizerState: no update for optimizer type '{}'", type);
  }
}

cpu::AdamDirection OptimizerState::direction(bool decay, bool eps_inside_sqrt) const {
  return {static_cast<float>(opt_.eps), eps_inside_sqrt, decay ? static_cast<float>(opt_.weight_decay) : 0.0f};
}

std::vector<double> OptimizerState::weight_and_update_squares(const float* p, const float* m, const float* v,
                                                              bool eps_inside_sqrt) {
  const size_t nt = static_cast<size_t>(num_tensors_);
  std::vector<double> sq(2 * nt, 0.0);
  for (const Segment& s : segments_) {
    if (!s.counted) continue;
    const size_t i = static_cast<size_t>(s.tensor);
    cpu::adam_direction_norms(p + s.off, m + s.off, v + s.off, s.n, direction(s.decay, eps_inside_sqrt), &sq[i],
                              &sq[nt + i], nullptr);
  }
  return world_sum(sq);
}

void OptimizerState::update_lamb(double lr, double gs, TypedPtr grads) {
  float *p = master_params(), *m = exp_avg(), *v = exp_avg_sq();
  const float b1 = static_cast<float>(opt_.beta1), b2 = static_cast<float>(opt_.beta2);
  with_grads(grads, [&](auto* g) { cpu::adam_moments(g, m, v, opt_count(), b1, b2, static_cast<float>(gs)); });
  const size_t nt = static_cast<size_t>(num_tensors_);
  const std::vector<double> sq = weight_and_update_squares(p, m, v, opt_.eps_inside_sqrt);
  auto dir = [&](bool decay) { return direction(decay, opt_.eps_inside_sqrt); };
  const double t = static_cast<double>(adam_steps_);
  const double step = opt_.bias_correction
                          ? lr * std::sqrt(1.0 - std::pow(opt_.beta2, t)) / (1.0 - std::pow(opt_.beta1, t))
                          : lr;
  for (const Segment& s : segments_) {
    const size_t i = static_cast<size_t>(s.tensor);
    const double ratio = clamp_ratio(sq[i], sq[nt + i], opt_.min_coeff, opt_.max_coeff);
    cpu::adam_direction_apply(p + s.off, m + s.off, v + s.off, s.n, dir(s.decay), static_cast<float>(step * ratio),
                              nullptr);
  }
}

void OptimizerState::update_onebit_adam(double lr, double gs, TypedPtr grads) {
  float *p = master_params(), *m = exp_avg(), *v = exp_avg_sq();
  const float b1 = static_cast<float>(opt_.beta1), b2 = static_cast<float>(opt_.beta2);
  with_grads(grads, [&](auto* g) {
    cpu::adam_moments(g, m, frozen_ ? nullptr : v, opt_count(), b1, b2, static_cast<float>(gs));
  });
  if (frozen_ && onebit_) onebit_->run(m);
  cpu::for_each_decay_run(opt_begin(), opt_count(), decay_, [&](int64_t o, int64_t n, bool d) {
    const cpu::AdamDirection dir{static_cast<float>(opt_.eps), false, d ? static_cast<float>(opt_.weight_decay) : 0.0f};
    cpu::adam_direction_apply(p + o, m + o, v + o, n, dir, static_cast<float>(lr), nullptr);
  });
}

void OptimizerState::update_zero_one_adam(double lr, double gs, TypedPtr grads) {
  float *p = master_params(), *m = exp_avg(), *v = exp_avg_sq(), *u = accum_.as<float>();
  const int64_t n = opt_count(), t = adam_steps_;
  const float b1 = static_cast<float>(opt_.beta1), b2 = static_cast<float>(opt_.beta2);
  const float eps = static_cast<float>(opt_.eps), fgs = static_cast<float>(gs);
  auto apply = [&](float* accum) {
    cpu::for_each_decay_run(opt_begin(), n, decay_, [&](int64_t o, int64_t k, bool d) {
      const cpu::AdamDirection dir{eps, false, d ? static_cast<float>(opt_.weight_decay) : 0.0f};
      cpu::adam_direction_apply(p + o, m + o, v + o, k, dir, static_cast<float>(lr), accum ? accum + o : nullptr);
    });
  };
  if (!frozen_) {
    if (full_step_) {
      with_grads(grads, [&](auto* g) { cpu::adam_moments(g, m, v, n, b1, b2, fgs); });
    } else if (onebit_) {  // the gradient itself travels 1-bit
      with_grads(grads, [&](auto* g) { cpu::scaled_to_f32(u, g, n, fgs); });
      onebit_->run(u);
      cpu::adam_moments(u, m, static_cast<float*>(nullptr), n, b1, b2, 1.0f);
      std::memset(u, 0, static_cast<size_t>(n) * sizeof(float));
    } else {
      with_grads(grads, [&](auto* g) { cpu::adam_moments(g, m, static_cast<float*>(nullptr), n, b1, b2, fgs); });
    }
    apply(nullptr);
    if (t % var_interval_ == 0 && ++var_counter_ == opt_.var_update_scaler) {
      var_counter_ = 0;
      var_interval_ *= 2;
    }
    if (t > opt_.var_freeze_step) {
      frozen_ = true;
      if (onebit_) onebit_->reset_errors();  // they now hold errors of another quantity
    }
    return;
  }
  with_grads(grads, [&](auto* g) { cpu::adam_moments(g, m, static_cast<float*>(nullptr), n, b1, b2, fgs); });
  lrs_ += lr;
  apply(u);
  if (t % local_step_interval_ == 0) {
    // Undo the local steps, exchange their sum (in gradient units), redo them as the mean.
    for (int64_t i = 0; i < n; ++i) {
      p[i] -= u[i];
      u[i] *= std::sqrt(v[i]) + eps;
    }
    if (onebit_) onebit_->run(u);
    const float inv_lrs = static_cast<float>(1.0 / lrs_);
    for (int64_t i = 0; i < n; ++i) {
      m[i] = -u[i] * inv_lrs;
      p[i] += u[i] / (std::sqrt(v[i]) + eps);
      u[i] = 0.0f;
    }
    lrs_ = 0;
  }
  if (++local_step_counter_ == opt_.local_step_scaler) {
    local_step_counter_ = 0;
    local_step_interval_ = std::min(opt_.local_step_clipper, local_step_interval_ * 2);
  }
}

void OptimizerState::update_onebit_lamb(double lr, double gs, TypedPtr grads) {
  float *p = master_params(), *m = exp_avg(), *v = exp_avg_sq(), *vf = exp_avg_sq_fresh_.as<float>();
  const int64_t n = opt_count();
  const float b1 = static_cast<float>(opt_.beta1), b2 = static_cast<float>(opt_.beta2);
  const float eps = static_cast<float>(opt_.eps), fgs = static_cast<float>(gs);
  const size_t nt = static_cast<size_t>(num_tensors_);
  auto dir = [&](bool decay) { return direction(decay, false); };
  if (!frozen_) {
    with_grads(grads, [&](auto* g) { cpu::adam_moments(g, m, v, n, b1, b2, fgs); });
    if (adam_steps_ == opt_.freeze_step) std::memcpy(vf, v, static_cast<size_t>(n) * sizeof(float));
    const std::vector<double> sq = weight_and_update_squares(p, m, v, false);
    std::vector<double> ratio(nt, 1.0);
    for (size_t i = 0; i < nt; ++i) {
      ratio[i] = clamp_ratio(sq[i], sq[nt + i], opt_.min_coeff, opt_.max_coeff);
      if (ratio[i] != 1.0) {
        lamb_coeff_freeze_[i] = opt_.coeff_beta * lamb_coeff_freeze_[i] + (1.0 - opt_.coeff_beta) * ratio[i];
      }
    }
    for (const Segment& s : segments_) {
      const auto r = static_cast<float>(lr * ratio[static_cast<size_t>(s.tensor)]);
      cpu::adam_direction_apply(p + s.off, m + s.off, v + s.off, s.n, dir(s.decay), r, nullptr);
    }
    return;
  }
  // The momentum scales, once, at the first compressed step: each tensor to the tensors' mean RMS.
  if (scaling_coeff_.empty()) {
    std::vector<double> msq(2 * nt, 0.0);
    for (const Segment& s : segments_) {
      if (!s.counted) continue;
      const size_t i = static_cast<size_t>(s.tensor);
      msq[i] += cpu::sum_of_squares(m + s.off, s.n);
      msq[nt + i] += static_cast<double>(s.n);
    }
    msq = world_sum(msq);
    double united = 0;
    int present = 0;
    std::vector<double> rms(nt, 0.0);
    for (size_t i = 0; i < nt; ++i) {
      if (msq[nt + i] <= 0) continue;
      rms[i] = std::sqrt(msq[i] / msq[nt + i]);
      united += rms[i];
      ++present;
    }
    united /= std::max(present, 1);
    scaling_coeff_.assign(nt, 1.0);
    for (size_t i = 0; i < nt; ++i) scaling_coeff_[i] = rms[i] > 0 ? united / rms[i] : 1.0;
  }
  float* last = last_exp_avg_.as<float>();
  std::memcpy(last, m, static_cast<size_t>(n) * sizeof(float));
  with_grads(grads, [&](auto* g) { cpu::adam_moments(g, m, static_cast<float*>(nullptr), n, b1, b2, fgs); });
  auto scale_segments = [&](bool up) {
    for (const Segment& s : segments_) {
      const double c = scaling_coeff_[static_cast<size_t>(s.tensor)];
      const auto k = static_cast<float>(up ? c : 1.0 / c);
      for (int64_t i = s.off; i < s.off + s.n; ++i) m[i] *= k;
    }
  };
  scale_segments(true);
  if (onebit_) onebit_->run(m);
  scale_segments(false);
  for (int64_t i = 0; i < n; ++i) {
    const float g = (m[i] - last[i] * b1) / (1.0f - b1);
    vf[i] = b2 * vf[i] + (1.0f - b2) * g * g;
  }
  std::vector<double> sq(3 * nt, 0.0), ratio_max(nt, 0.0);
  for (const Segment& s : segments_) {
    if (!s.counted) continue;
    const size_t i = static_cast<size_t>(s.tensor);
    double unused = 0;
    cpu::adam_direction_norms(p + s.off, m + s.off, v + s.off, s.n, dir(s.decay), &unused, &sq[i], &sq[nt + i]);
    sq[2 * nt + i] = s.decay ? 1.0 : 0.0;
    ratio_max[i] = cpu::denom_ratio_max(v + s.off, vf + s.off, s.n, eps, ratio_max[i]);
  }
  sq = world_sum(sq);
  ratio_max = world_max(ratio_max);
  std::vector<double> coeff(nt, 0.0);
  for (size_t i = 0; i < nt; ++i) {
    double factor = ratio_max[i];
    if (sq[2 * nt + i] > 0 && opt_.weight_decay > 0 && sq[i] > 0) {
      const double update_ratio = std::min(1.0, std::sqrt(sq[nt + i]) / std::sqrt(sq[i]));
      factor = factor * update_ratio + (1.0 - update_ratio);
    }
    factor = std::clamp(factor, opt_.factor_min, opt_.factor_max);
    factor = std::clamp(factor, last_factor_[i] * (1.0 - opt_.factor_threshold),
                        last_factor_[i] * (1.0 + opt_.factor_threshold));
    last_factor_[i] = factor;
    coeff[i] = lamb_coeff_freeze_[i] * factor;
  }
  for (const Segment& s : segments_) {
    const auto r = static_cast<float>(lr * coeff[static_cast<size_t>(s.tensor)]);
    cpu::adam_direction_apply(p + s.off, m + s.off, v + s.off, s.n, dir(s.decay), r, nullptr);
  }
}

nlohmann::json OptimizerState::scalar_state() const {
  const std::string& t = opt_.type;
  if (t == "ZeroOneAdam") {
    return {{"frozen", frozen_},
            {"var_interval", var_interval_},
            {"var_counter", var_counter_},
            {"local_step_interval", local_step_interval_},
            {"local_step_counter", local_step_counter_},
            {"lrs", lrs_}};
  }
  if (t == "OneBitLamb") {
    return {{"lamb_coeff_freeze", lamb_coeff_freeze_}, {"last_factor", last_factor_}, {"scaling_coeff", scaling_coeff_}};
  }
  return nullptr;
}

void OptimizerState::restore_scalar_state(const nlohmann::json& j, const std::string& where) {
  const std::string& t = opt_.type;
  if (t != "ZeroOneAdam" && t != "OneBitLamb") return;
  if (!j.is_object()) {
    throw invalid_argument("{}: no optimizer_state for {} (the checkpoint was written by another optimizer)", where, t);
  }
  try {
    if (t == "ZeroOneAdam") {
      frozen_ = j.at("frozen").get<bool>();
      var_interval_ = j.at("var_interval").get<int64_t>();
      var_counter_ = j.at("var_counter").get<int64_t>();
      local_step_interval_ = j.at("local_step_interval").get<int64_t>();
      local_step_counter_ = j.at("local_step_counter").get<int64_t>();
      lrs_ = j.at("lrs").get<double>();
    } else {
      lamb_coeff_freeze_ = j.at("lamb_coeff_freeze").get<std::vector<double>>();
      last_factor_ = j.at("last_factor").get<std::vector<double>>();
      scaling_coeff_ = j.at("scaling_coeff").get<std::vector<double>>();
      if (lamb_coeff_freeze_.size() != static_cast<size_t>(num_tensors_) ||
          last_factor_.size() != static_cast<size_t>(num_tensors_)) {
        throw invalid_argument("{}: optimizer_state holds {} tensors' coefficients where this model has {}", where,
                               lamb_coeff_freeze_.size(), num_tensors_);
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw invalid_argument("{}: optimizer_state: {}", where, e.what());
  }
  // As DeepSpeed's load_state_dict: the error-feedback buffers start again from zero.
  if (onebit_) onebit_->reset_errors();
}

}  // namespace ds::rt::train
