// The optimizer and scheduler sections, with DeepSpeed's names. The optimizer is one of
// DeepSpeed's: Adam or AdamW (decoupled weight decay: always for "AdamW", for "Adam" unless
// params.adam_w_mode is false, as in DeepSpeed), Lamb (FusedLamb), Adagrad (DeepSpeedCPUAdagrad),
// Lion (FusedLion), and the 1-bit ones, OneBitAdam, ZeroOneAdam and OneBitLamb; each takes its
// DeepSpeed class's parameter names and defaults, and a parameter of another type is an error,
// as the class's constructor would reject it. The scheduler is one of DeepSpeed's warmup schedules (WarmupLR, WarmupDecayLR,
// WarmupCosineLR, deepspeed/runtime/lr_schedules.py), read in two steps: its type where the
// file's order puts it, its parameters once optimizer.lr and training.steps are known, since
// WarmupLR's warmup_max_lr defaults to the lr and the decaying schedules' total_num_steps to the
// training steps. A parameter of another schedule type is an error, as DeepSpeed's constructors
// reject unexpected keyword arguments.
#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include "config/config_sections.h"

namespace ds::config::detail {

namespace {

const std::vector<std::string> kDsOptimizerIgnored = {"legacy_fusion"};
const std::vector<std::string> kDsOptimizerParamsIgnored = {"torch_adam", "bias_correction",
                                                            "amsgrad", "max_grad_norm"};

void read_betas(ReadContext& ctx, Section& p, OptimizerConfig& out) {
  const Json* betas = p.raw("betas");
  if (!betas || auto_needs_value(ctx, p.child("betas"), *betas)) return;
  bool ok = betas->is_array() && betas->size() == 2 && (*betas)[0].is_number() &&
            (*betas)[1].is_number();
  double b1 = ok ? (*betas)[0].get<double>() : 0, b2 = ok ? (*betas)[1].get<double>() : 0;
  if (!ok || b1 < 0 || b1 >= 1 || b2 < 0 || b2 >= 1) {
    ctx.error(p.child("betas"),
              fmt::format("expected [beta1, beta2] with each in [0, 1), got {}", show(*betas)));
  } else {
    out.beta1 = b1;
    out.beta2 = b2;
  }
}

void read_adam_w_mode(ReadContext& ctx, Section& p, OptimizerConfig& out) {
  bool w_mode = true;
  bool w_given = p.get_bool("adam_w_mode", w_mode);
  if (out.type == "AdamW") {
    if (w_given && !w_mode) {
      ctx.warn(p.child("adam_w_mode"),
               "ignored: \"AdamW\" always uses decoupled weight decay (as in DeepSpeed); use "
               "\"Adam\" with adam_w_mode false for L2 weight decay");
    }
    out.adam_w_mode = true;
  } else {
    out.adam_w_mode = w_mode;
  }
}

// The decaying schedules' total_num_steps: given, or training.steps.
void read_total_num_steps(ReadContext& ctx, Section& sched, Section& p, const JobConfig& cfg,
                          bool steps_valid, SchedulerConfig& out) {
  if (p.has("total_num_steps")) {
    p.get_int("total_num_steps", out.total_num_steps, 1, kI64Max);
    return;
  }
  p.raw("total_num_steps");
  if (steps_valid) {
    out.total_num_steps = cfg.training.steps;
  } else {
    ctx.error(p.present() ? p.path() : sched.path(),
              fmt::format("{} needs params.total_num_steps (or training.steps to take it from)",
                          out.type));
  }
}

// Parameters of the other DeepSpeed warmup schedules: name the type they do not fit.
void reject_foreign_params(ReadContext& ctx, Section& p, const std::string& type) {
  std::vector<std::string> foreign;
  if (type == "WarmupCosineLR") {
    foreign = {"warmup_min_lr", "warmup_max_lr"};
  } else {
    foreign = {"warmup_min_ratio", "cos_min_ratio"};
    if (type == "WarmupLR") foreign.push_back("total_num_steps");
  }
  for (const auto& k : foreign) {
    if (!p.has(k)) continue;
    p.raw(k);
    ctx.error(p.child(k), fmt::format("not a parameter of {} (DeepSpeed would reject it)", type));
  }
}

void read_params_of_type(ReadContext& ctx, Section& sched, Section& p, const JobConfig& cfg,
                         bool steps_valid, SchedulerConfig& out) {
  const std::string& t = out.type;
  if (t != "WarmupCosineLR") {
    p.get_number("warmup_min_lr", out.warmup_min_lr, 0);
    bool max_given = p.get_number("warmup_max_lr", out.warmup_max_lr, 0);
    if (!max_given && t == "WarmupLR" && !p.has("warmup_max_lr")) {
      out.warmup_max_lr = cfg.optimizer.lr;
    }
  } else {
    p.get_number("warmup_min_ratio", out.warmup_min_ratio, 0, 1);
    p.get_number("cos_min_ratio", out.cos_min_ratio, 0, 1);
  }
  p.get_int("warmup_num_steps", out.warmup_num_steps, 1, kI64Max);
  p.get_choice("warmup_type", out.warmup_type, {"log", "linear"});
  if (t != "WarmupLR") read_total_num_steps(ctx, sched, p, cfg, steps_valid, out);
  if (p.has("last_batch_iteration")) {
    p.raw("last_batch_iteration");
    ctx.warn(p.child("last_batch_iteration"),
             "DeepSpeed key accepted but not acted on by dstrain (resuming restores the step "
             "from the checkpoint)");
  }
  reject_foreign_params(ctx, p, t);
}

// The parameters each type reads (beside lr, which all take) and those it accepts without acting
// on them, after the DeepSpeed class's constructor.
struct TypeParams {
  std::vector<std::string> read, ignored;
};

TypeParams params_of(const std::string& t) {
  const std::vector<std::string> onebit_ignored = {"bias_correction", "eps_inside_sqrt", "max_grad_norm",
                                                   "amsgrad", "cuda_aware", "comm_backend_name"};
  if (t == "Adam" || t == "AdamW") return {{"betas", "eps", "weight_decay", "adam_w_mode"}, kDsOptimizerParamsIgnored};
  if (t == "Lamb") {
    return {{"betas", "eps", "weight_decay", "bias_correction", "eps_inside_sqrt", "max_coeff", "min_coeff"},
            {"max_grad_norm", "amsgrad"}};
  }
  if (t == "Adagrad") return {{"eps", "weight_decay"}, {"amsgrad", "fp32_optimizer_states"}};
  if (t == "Lion") return {{"betas", "weight_decay"}, {}};
  if (t == "OneBitAdam") return {{"betas", "eps", "weight_decay", "freeze_step"}, onebit_ignored};
  if (t == "ZeroOneAdam") {
    return {{"betas", "eps", "weight_decay", "var_freeze_step", "var_update_scaler", "local_step_scaler",
             "local_step_clipper"},
            onebit_ignored};
  }
  return {{"betas", "eps", "weight_decay", "freeze_step", "max_coeff", "min_coeff", "coeff_beta", "factor_max",
           "factor_min", "factor_threshold"},
          onebit_ignored};  // OneBitLamb
}

// DeepSpeed's defaults for the type (its class's constructor), before the file's params.
void type_defaults(OptimizerConfig& out) {
  const std::string& t = out.type;
  if (t == "Adam" || t == "AdamW") return;
  out.weight_decay = 0;
  if (t == "Adagrad") {
    out.lr = 1e-2;
    out.eps = 1e-10;
  }
}

bool contains(const std::vector<std::string>& v, const std::string& k) {
  return std::find(v.begin(), v.end(), k) != v.end();
}

// A parameter of another optimizer type: named, as DeepSpeed's constructor would reject it.
void reject_other_types_params(ReadContext& ctx, Section& p, const std::string& type, const TypeParams& mine) {
  std::vector<std::string> named;
  for (const char* t : {"Adam", "Lamb", "Adagrad", "Lion", "OneBitAdam", "ZeroOneAdam", "OneBitLamb"}) {
    const TypeParams other = params_of(t);
    for (const auto* list : {&other.read, &other.ignored}) {
      for (const std::string& k : *list) {
        if (!p.has(k) || contains(mine.read, k) || contains(mine.ignored, k) || contains(named, k)) continue;
        named.push_back(k);
        p.raw(k);
        ctx.error(p.child(k), fmt::format("not a parameter of {} (DeepSpeed would reject it)", type));
      }
    }
  }
}

void read_type_params(ReadContext& ctx, Section& p, OptimizerConfig& out) {
  const TypeParams mine = params_of(out.type);
  auto reads = [&](const char* k) { return contains(mine.read, k); };
  p.get_number("lr", out.lr, 0);
  if (reads("betas")) read_betas(ctx, p, out);
  if (reads("eps")) p.get_number("eps", out.eps, 0, kInf, /*lo_open=*/true);
  p.get_number("weight_decay", out.weight_decay, 0);
  if (reads("adam_w_mode")) read_adam_w_mode(ctx, p, out);
  if (out.type == "Lamb") {
    p.get_bool("bias_correction", out.bias_correction);
    p.get_bool("eps_inside_sqrt", out.eps_inside_sqrt);
  }
  if (reads("max_coeff")) {
    p.get_number("max_coeff", out.max_coeff, 0, kInf, /*lo_open=*/true);
    p.get_number("min_coeff", out.min_coeff, 0);
    if (out.min_coeff > out.max_coeff) {
      ctx.error(p.child("min_coeff"),
                fmt::format("{} is above max_coeff {}: the trust ratio is clamped to [min_coeff, max_coeff]",
                            out.min_coeff, out.max_coeff));
    }
  }
  if (reads("freeze_step")) p.get_int("freeze_step", out.freeze_step, 0, kI64Max);
  if (reads("var_freeze_step")) {
    p.get_int("var_freeze_step", out.var_freeze_step, 0, kI64Max);
    p.get_int("var_update_scaler", out.var_update_scaler, 1, kI64Max);
    p.get_int("local_step_scaler", out.local_step_scaler, 1, kI64Max);
    p.get_int("local_step_clipper", out.local_step_clipper, 1, kI64Max);
  }
  if (reads("coeff_beta")) {
    p.get_number("coeff_beta", out.coeff_beta, 0, 1);
    p.get_number("factor_max", out.factor_max, 0, kInf, /*lo_open=*/true);
    p.get_number("factor_min", out.factor_min, 0, kInf, /*lo_open=*/true);
    p.get_number("factor_threshold", out.factor_threshold, 0);
  }
  const Json* ams = p.has("amsgrad") ? p.raw("amsgrad") : nullptr;
  if (ams && ams->is_boolean() && ams->get<bool>() && out.type != "Adam" && out.type != "AdamW") {
    ctx.error(p.child("amsgrad"), fmt::format("{} has no AMSGrad variant (DeepSpeed refuses it too)", out.type));
  }
  reject_other_types_params(ctx, p, out.type, mine);
  p.ignored(mine.ignored);
}

}  // namespace

void read_optimizer(ReadContext& ctx, Section& root, OptimizerConfig& out) {
  Section s = root.section("optimizer");
  // DeepSpeed lower-cases the type; "OnebitAdam"/"OnebitLamb" are the spellings of its examples.
  const Json* t = s.has("type") ? s.raw("type") : nullptr;
  std::string given = t && t->is_string() ? t->get<std::string>() : "";
  for (char& c : given) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (given == "onebitadam" || given == "onebitlamb") {
    out.type = given == "onebitadam" ? "OneBitAdam" : "OneBitLamb";
  } else {
    s.get_choice("type", out.type,
                 {"Adam", "AdamW", "Lamb", "Adagrad", "Lion", "OneBitAdam", "ZeroOneAdam", "OneBitLamb"},
                 /*case_insensitive=*/true);
  }
  type_defaults(out);
  Section p = s.section("params");
  read_type_params(ctx, p, out);
  p.finish();
  s.ignored(kDsOptimizerIgnored);
  s.finish();
}

Json optimizer_to_json(const OptimizerConfig& c) {
  const TypeParams mine = params_of(c.type);
  Json p{{"lr", c.lr}, {"weight_decay", c.weight_decay}};
  auto has = [&](const char* k) { return contains(mine.read, k); };
  if (has("betas")) p["betas"] = Json::array({c.beta1, c.beta2});
  if (has("eps")) p["eps"] = c.eps;
  if (has("adam_w_mode")) p["adam_w_mode"] = c.adam_w_mode;
  if (c.type == "Lamb") {
    p["bias_correction"] = c.bias_correction;
    p["eps_inside_sqrt"] = c.eps_inside_sqrt;
  }
  if (has("max_coeff")) {
    p["max_coeff"] = c.max_coeff;
    p["min_coeff"] = c.min_coeff;
  }
  if (has("freeze_step")) p["freeze_step"] = c.freeze_step;
  if (has("var_freeze_step")) {
    p["var_freeze_step"] = c.var_freeze_step;
    p["var_update_scaler"] = c.var_update_scaler;
    p["local_step_scaler"] = c.local_step_scaler;
    p["local_step_clipper"] = c.local_step_clipper;
  }
  if (has("coeff_beta")) {
    p["coeff_beta"] = c.coeff_beta;
    p["factor_max"] = c.factor_max;
    p["factor_min"] = c.factor_min;
    p["factor_threshold"] = c.factor_threshold;
  }
  return Json{{"type", c.type}, {"params", p}};
}


SchedulerSection read_scheduler_type(ReadContext& ctx, Section& root, SchedulerConfig& out) {
  SchedulerSection sched{root.section("scheduler", /*nullable=*/true)};
  if (!sched.section.present()) return sched;
  Section& s = sched.section;
  const Json* t = s.raw("type");
  if (!t) {
    ctx.error(s.path(), "missing \"type\" (expected one of \"WarmupLR\", \"WarmupDecayLR\", "
                        "\"WarmupCosineLR\"; omit the section for a constant lr)");
  } else if (t->is_string() && (t->get<std::string>() == "OneCycle" ||
                                t->get<std::string>() == "LRRangeTest")) {
    ctx.error(s.child("type"),
              fmt::format("{} is a DeepSpeed schedule dstrain does not implement (expected one "
                          "of \"WarmupLR\", \"WarmupDecayLR\", \"WarmupCosineLR\")",
                          show(*t)));
  } else {
    sched.type_valid =
        s.get_choice("type", out.type, {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"});
  }
  return sched;
}

void read_scheduler_params(ReadContext& ctx, SchedulerSection& sched, const JobConfig& cfg,
                           bool steps_valid, SchedulerConfig& out) {
  if (!sched.section.present()) return;
  Section p = sched.section.section("params");
  if (sched.type_valid) {
    read_params_of_type(ctx, sched.section, p, cfg, steps_valid, out);
  } else {
    // Unknown type: the type error says it all; accept every DeepSpeed parameter name.
    for (const char* k : {"warmup_min_lr", "warmup_max_lr", "warmup_min_ratio", "cos_min_ratio",
                          "total_num_steps", "warmup_num_steps", "warmup_type",
                          "last_batch_iteration"}) {
      p.raw(k);
    }
  }
  p.finish();
  sched.section.finish();
}

Json scheduler_to_json(const SchedulerConfig& c) {
  if (c.type.empty()) return nullptr;
  Json p = Json::object();
  if (c.type == "WarmupCosineLR") {
    p["warmup_min_ratio"] = c.warmup_min_ratio;
    p["cos_min_ratio"] = c.cos_min_ratio;
  } else {
    p["warmup_min_lr"] = c.warmup_min_lr;
    p["warmup_max_lr"] = c.warmup_max_lr;
  }
  p["warmup_num_steps"] = c.warmup_num_steps;
  p["warmup_type"] = c.warmup_type;
  if (c.type != "WarmupLR") p["total_num_steps"] = c.total_num_steps;
  return Json{{"type", c.type}, {"params", p}};
}

}  // namespace ds::config::detail
