// The training loop (trainer.h), composed of its pieces:
//   parallel::Engine         the groups and the model with its hook stack (parallel/engine.h)
//   OptimizerState           master weights, AdamW's moments, the update (optimizer_state.h)
//   step math                the global loss, norm, overflow and the update (step_math.h)
//   checkpoints              save and resume, any layout (checkpointing.h)
//   initial weights, export  initial_weights.h, weights_export.h
// What remains here is the configuration of those pieces and the loop itself.
#include "train/trainer.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/verify.h"
#include "common/env.h"
#include "common/error.h"
#include "common/preemption.h"
#include "core/allocator.h"
#include "data/blend.h"
#include "data/loader.h"
#include "data/token_file.h"
#include "comm/comm.h"
#include "kernels/cuda_kernel_table.h"
#include "kernels/dispatch.h"
#include "kernels/typed.h"
#include "layout/choices.h"
#include "layout/context_parallel.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "parallel/engine.h"
#include "train/async_checkpoint.h"
#include "train/checkpointing.h"
#include "train/elastic_metrics.h"
#include "train/initial_weights.h"
#include "train/metrics.h"
#include "train/monitors.h"
#include "train/run_report.h"
#include "train/optimizer_state.h"
#include "train/spike_guard.h"
#include "train/straggler.h"
#include "train/run_config.h"
#include "train/sampling.h"
#include "train/step_clock.h"
#include "train/step_graph.h"
#include "train/step_math.h"
#include "train/task_eval.h"
#include "train/throughput.h"
#include "train/lora_weights.h"
#include "train/weights_export.h"

namespace ds::rt::train {

namespace ms = ds::model_spec;
using Clock = std::chrono::steady_clock;
using layout::Precision;

// Evaluation's scope: no dropout (LoRA's) while it lives, training again after.
struct EvalMode {
  Model& m;
  explicit EvalMode(Model& model) : m(model) { m.set_training(false); }
  ~EvalMode() { m.set_training(true); }
};

struct Trainer::Impl {
  config::JobConfig cfg;
  TrainOptions opt;
  ms::ModelShape shape;
  Precision precision = Precision::kFp32;
  Device device = Device::kCpu;
  int B = 0, T = 0, G = 1;
  int cp = 1, Tl = 0;  // context parallelism: T tokens a sequence, this rank's Tl = T / cp of them
  bool masked = false;  // the training data has loss masks (data/sft.h): the loss is over counted tokens
  bool moe = false;    // a mixture of experts: the load-balancing loss is reported beside the loss
  int rank = 0, world = 1;
  Allocator& alloc = Allocator::process();

  std::unique_ptr<data::TokenCorpus> train_file, val_file;  // one file or shards (null with a blend)
  std::unique_ptr<data::BatchReader> loader;  // one corpus, or a weighted blend (data/blend.h)
  std::unique_ptr<data::ValidationLoader> val_loader;
  std::vector<EvalTask> eval_tasks;  // training.eval_tasks, tokenized (task_eval.h)
  // training.cuda_graph: the model's stream and the step's graph (step_graph.h); null when off.
  std::unique_ptr<StepGraph> graph;
  bool graph_warm = false;  // a step of this run has run eagerly: every lazy allocation is made
  // Declaration order is destruction order reversed: the state before the engine it points into.
  std::unique_ptr<parallel::Engine> engine;
  comm::CommPtr onebit_host_dp;  // a GPU run's 1-bit optimizer: its dp group over host memory
  std::unique_ptr<OptimizerState> state;
  std::unique_ptr<OptimizerState> expert_state;  // a mixture of experts: the expert region's (null otherwise)
  std::vector<OptimizerState*> optimizer_states() {
    std::vector<OptimizerState*> v{state.get()};
    if (expert_state) v.push_back(expert_state.get());
    return v;
  }
  // Every optimizer state with the reduced gradients of its range (after the step's micro-batches).
  std::vector<OptimizerPart> optimizer_parts() {
    std::vector<OptimizerPart> parts{{state.get(), engine->zero().opt_grads()}};
    if (expert_state) parts.push_back({expert_state.get(), engine->expert_zero()->opt_grads()});
    return parts;
  }
  // Inputs and targets (B*Tl int32 each) of one micro-batch, or of G with a pipeline or a CUDA
  // graph (then in pinned host memory, which the graph's copies read at each replay).
  Buffer tokens;
  // With context parallelism: one whole micro-batch (B*T inputs and targets) as the loader reads
  // it, before this rank's rows are copied out (layout::cp_position_runs).
  Buffer whole_tokens;
  std::vector<layout::PositionRun> runs;
  std::unique_ptr<optim::LrScheduler> schedule;
  std::unique_ptr<optim::LossScaler> scaler;
  std::unique_ptr<SpikeGuard> spikes;  // training.skip_spikes (null: off)
  std::unique_ptr<StragglerWatch> stragglers;  // with wall_clock_breakdown at world > 1
  ElasticMetrics elastic;                       // after an elastic restart (dstrain launch --nnodes)
  // training.checkpoint_async with a checkpoint_dir: the writer thread and its staging buffer.
  // Declared after the state it copies from, so it is destroyed (its write joined) first.
  std::unique_ptr<AsyncCheckpointer> async_ckpt;
  int64_t next_step = 1;  // the step the next run() executes
  double flops_per_token = 0;  // MFU (throughput.h)
  PeakFlops peak;
  std::unique_ptr<TextCodec> codec;  // with training.sample_interval (sampling.h)

  int dp() const { return cfg.data_parallel_size; }
  int pp() const { return cfg.pipeline.stages; }
  int32_t* mb_inputs(int g) { return tokens.as<int32_t>() + static_cast<size_t>(g) * 2 * B * Tl; }
  int32_t* mb_targets(int g) { return mb_inputs(g) + static_cast<size_t>(B) * Tl; }
  // Micro-batch g's tokens from `next` (a loader's next(inputs, targets)): this rank's rows.
  template <typename Next>
  void load(int g, Next&& next);
  // The rank that holds a (dp, cp, tp) position's loss: tp rank 0 of the last stage. Under
  // context parallelism every cp rank holds the mean over its rows; the step's loss is their mean.
  bool loss_owner() const { return engine->coord().tp == 0 && engine->coord().pp == pp() - 1; }
  CheckpointedRun checkpointed() {
    return {cfg, *engine, *state, expert_state.get(), *loader, *schedule, *scaler, spikes.get()};
  }

  void open_data(int dp_rank);
  // training.cuda_graph: refuses what only the data or the run shows (config_validate.h refuses the
  // rest), creates the stream the model and ZeRO run on, into `spec`.
  void start_graph(parallel::EngineSpec& spec);
  void build(int local_rank);
  void start_or_resume();
  // This rank's sums over the step's micro-batches of the loss and of the load-balancing loss.
  struct LossSums {
    double loss = 0, aux = 0;
  };
  LossSums micro_batches(int64_t step, double grad_scale, double* bubble, StepClock& clock);
  // Collective: every rank's compute time (forward + backward) into the record
  // (time_compute_ms_rank<q>), and a straggler named in the log (straggler.h).
  void report_stragglers(const StepBreakdown& b, int64_t step, StepRecord& r);
  LossSums pipeline_micro_batches(int64_t step, float scale, double* bubble, StepClock& clock);
  // training.cuda_graph: the G micro-batches' forward and backward as one replay of the graph
  // (captured at the second step of the run, and again when the loss scale changes).
  LossSums graph_micro_batches(float scale, StepClock& clock);
  double evaluate();
  // training.eval_tasks: each task's score over every data-parallel rank's share of its rows.
  std::vector<TaskScore> evaluate_tasks();
  std::vector<RowScore> score_rows(const std::vector<const EvalRow*>& rows);
  std::string describe_run() const;
  StepRecord train_step(int64_t step, const UpdateSettings& settings, bool* preempt_after_step);
  void run_steps(int64_t stop, const UpdateSettings& settings, MetricsReporter& reporter, TrainResult& result);
  void record_peaks(StepRecord& r);
  void check_sampling();
  void print_sample(int64_t step, MetricsReporter& reporter);
  void note_planned_memory(StepRecord& r, MetricsReporter& reporter);
};

// Data first: a bad corpus should fail before we connect or allocate the model.
void Trainer::Impl::open_data(int dp_rank) {
  data::LoaderOptions lo;
  lo.batch_size = B;
  lo.seq_len = T;
  lo.data_parallel_size = dp();
  lo.data_parallel_rank = dp_rank;
  lo.grad_accum_steps = G;
  lo.shuffle = cfg.data.shuffle;
  lo.seed = cfg.training.seed;
  const int64_t vocab = cfg.model.shape.vocab_size;
  auto blend_of = [](const std::vector<config::DataConfig::BlendSource>& b) {
    std::vector<data::WeightedSource> out;
    for (const auto& s : b) out.push_back({s.path, s.weight});
    return out;
  };
  if (!cfg.data.train_blend.empty()) {
    loader = std::make_unique<data::BlendLoader>(blend_of(cfg.data.train_blend), lo, vocab);
  } else {
    train_file = std::make_unique<data::TokenCorpus>(cfg.data.train, vocab);
    loader = std::make_unique<data::DataLoader>(*train_file, lo);
  }
  masked = loader->has_mask();
  const bool eval = cfg.training.eval_interval > 0;
  const int64_t steps = cfg.training.eval_steps;
  if (eval && !cfg.data.val_blend.empty()) {
    val_loader = data::blend_validation_loader(blend_of(cfg.data.val_blend), B, T, dp(), dp_rank, steps, vocab);
  } else if (eval && !cfg.data.val.empty()) {
    val_file = std::make_unique<data::TokenCorpus>(cfg.data.val, vocab);
    val_loader = std::make_unique<data::ValidationLoader>(*val_file, B, T, dp(), dp_rank, steps);
  }
  if (!cfg.training.eval_tasks.empty()) {
    const auto spec = config_tokenizer(cfg);
    const auto task_codec = codec_for(cfg.model.shape.vocab_size, spec ? &*spec : nullptr);
    for (const auto& t : cfg.training.eval_tasks) {
      eval_tasks.push_back(read_eval_task(task_kind_of(t.task, "training.eval_tasks"), t.data, *task_codec, t.limit,
                                          cfg.model.shape.seq_len));
    }
  }
}

template <typename Next>
void Trainer::Impl::load(int g, Next&& next) {
  if (cp == 1) return next(mb_inputs(g), mb_targets(g));
  int32_t* in = whole_tokens.as<int32_t>();
  int32_t* tg = in + static_cast<size_t>(B) * T;
  next(in, tg);
  for (int b = 0; b < B; b++) {
    for (const auto& run : runs) {
      const size_t from = static_cast<size_t>(b) * T + run.global, to = static_cast<size_t>(b) * Tl + run.local;
      std::copy_n(in + from, run.length, mb_inputs(g) + to);
      std::copy_n(tg + from, run.length, mb_targets(g) + to);
    }
  }
}

void Trainer::Impl::build(int local_rank) {
  parallel::EngineSpec spec = engine_spec_of(cfg, rank, local_rank, device);
  // The data's dp rank, from the grid, before anything connects.
  const layout::Topology topo(world, spec.tp, spec.dp, spec.pp, spec.cp);
  open_data(topo.coord_of(rank).dp);
  if (cfg.training.cuda_graph) start_graph(spec);
  runs = layout::cp_position_runs(T, cp, topo.coord_of(rank).cp, spec.cp_method);
  engine = std::make_unique<parallel::Engine>(shape, spec, job_store(world), alloc);
  // LoRA: the optimizer's region is the adapters' (the base is frozen: no state at all).
  const int64_t region = shape.lora.on() ? engine->model().layout().adapter_begin : 0;
  // A GPU run's 1-bit optimizer exchanges its compressed momentum over host memory: a dp group
  // of the host world (the model's groups are NCCL's).
  if (cfg.optimizer.onebit() && device == Device::kCuda && dp() > 1) {
    const std::vector<int> dp_ranks = topo.group_of(rank, layout::Axis::kDp);
    onebit_host_dp = engine->host_world().comm()->new_group(dp_ranks, fmt::format("onebit_dp{}", dp_ranks.front()));
  }
  state = std::make_unique<OptimizerState>(cfg, precision, device, engine->model(), engine->zero(),
                                           engine->coord().tp, pp(), alloc, region, &engine->host_world(),
                                           onebit_host_dp.get());
  if (auto* ez = engine->expert_zero()) {
    expert_state = std::make_unique<OptimizerState>(cfg, precision, device, engine->model(), *ez, engine->coord().tp,
                                                    pp(), alloc, engine->model().layout().expert_begin,
                                                    &engine->host_world());
  }
  for (const auto* off : {&cfg.zero.offload_optimizer, &cfg.zero.offload_param}) {
    if (off->device == "cpu" && device == Device::kCpu && rank == 0) {
      const bool o = off == &cfg.zero.offload_optimizer;
      spdlog::info("ZeRO {}: device cpu: {} already live in host memory on a CPU run (same tags)",
                   o ? "offload_optimizer" : "offload_param", o ? "the optimizer states" : "the parameter partitions");
    }
  }
  tokens = alloc.allocate(2 * static_cast<size_t>(B) * Tl * (pp() > 1 || graph ? G : 1) * sizeof(int32_t),
                          MemTag::kWorkspace, "tokens", graph ? Device::kCudaHost : Device::kCpu);
  if (cp > 1) {
    whole_tokens = alloc.allocate(2 * static_cast<size_t>(B) * T * sizeof(int32_t), MemTag::kWorkspace,
                                  "tokens of whole sequences");
  }
  schedule = std::make_unique<optim::LrScheduler>(schedule_of(cfg));
  scaler = std::make_unique<optim::LossScaler>(loss_scaler_of(cfg.fp16));
  if (cfg.wall_clock_breakdown && world > 1) {
    stragglers = std::make_unique<StragglerWatch>(cfg.training.straggler_slower_by, cfg.training.straggler_steps);
  }
  if (cfg.training.skip_spikes.enabled) {
    spikes = std::make_unique<SpikeGuard>(cfg.training.skip_spikes.threshold, cfg.training.skip_spikes.window);
  }
  if (cfg.training.checkpoint_async && !cfg.training.checkpoint_dir.empty()) {
    auto run = checkpointed();
    async_ckpt = std::make_unique<AsyncCheckpointer>(run, alloc, device);
  }
  flops_per_token = model_flops_per_token(shape);
  moe = model_spec::family_of(shape).mlp == model_spec::MlpKind::kMoe;
  peak = run_peak_flops(cfg, device, engine->model().dtype(), spec.cuda_device);
}

void Trainer::Impl::start_or_resume() {
  std::optional<std::string> resume_dir;
  const std::string& root = cfg.training.checkpoint_dir;
  if (!opt.resume_from.empty()) {
    resume_dir = opt.resume_from;
  } else if (opt.resume) {
    if (root.empty()) {
      throw Error(ErrorKind::kInvalidArgument, fmt::format("--resume needs training.checkpoint_dir in {}", cfg.path),
                  "set training.checkpoint_dir (and checkpoint_interval) in the config");
    }
    resume_dir = ckpt::latest_checkpoint(root);
    if (!resume_dir) spdlog::info("--resume: no checkpoint in {} yet, starting fresh", root);
  }
  const std::string& init_from = !opt.init_from.empty() ? opt.init_from : cfg.model.init_from;
  // LoRA: the frozen base at every start (a checkpoint holds the adapters' state only).
  if (shape.lora.on()) init_lora_base(*engine, init_from, cfg.training.seed, alloc);
  if (!resume_dir) {
    if (shape.lora.on()) return init_lora_adapters(*engine, *state, cfg.lora.init_from, cfg.training.seed, alloc);
    init_weights(*engine, *state, init_from, cfg.training.seed, alloc);
    if (expert_state) init_weights(*engine, *expert_state, init_from, cfg.training.seed, alloc);
    return;
  }
  try {
    auto run = checkpointed();
    next_step = load_checkpoint(run, *resume_dir);
  } catch (const Error& e) {
    // A corrupt `latest`: say which older checkpoint is intact and how to use it; never pick one.
    if (!opt.resume_from.empty() || e.kind() != ErrorKind::kInvalidArgument || root.empty() ||
        ckpt::verify_checkpoint_dir(*resume_dir).ok) {
      throw;  // not corruption (another model, another precision, ...): the message says what
    }
    const auto intact = ckpt::newest_intact_checkpoint(root, *resume_dir);
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("{}; {}", e.what(),
                            intact ? fmt::format("the newest intact checkpoint is {}", *intact)
                                   : fmt::format("no other checkpoint in {} verifies", root)),
                intact ? fmt::format("resume from it with --resume-from {} (dstrain checkpoint verify {} lists "
                                     "what is corrupt)",
                                     *intact, root)
                       : fmt::format("dstrain checkpoint verify {} lists what is corrupt", root));
  }
}

Trainer::Trainer(const config::JobConfig& config, const TrainOptions& options) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.cfg = config;
  s.opt = options;
  config::require_training_sections(s.cfg);
  s.world = s.cfg.world_size;
  s.rank = static_cast<int>(env::get_int("RANK"));
  if (s.rank < 0 || s.rank >= s.world) {
    throw invalid_argument("RANK={} is outside the config's world of {} rank(s) ({})", s.rank, s.world, s.cfg.path);
  }
  const int local_rank = static_cast<int>(env::get_int("LOCAL_RANK"));
  s.device = select_device(s.cfg, s.rank, local_rank);
  // Every kern:: call of the constructor (initial values, master copies) runs on that device.
  const kern::DeviceScope device_scope(s.device);
  s.shape = s.cfg.model.shape;
  s.B = static_cast<int>(s.cfg.train_micro_batch_size_per_gpu);
  s.T = s.cfg.model.shape.seq_len;
  s.cp = s.cfg.context_parallel.size;
  s.Tl = s.T / s.cp;
  s.G = static_cast<int>(s.cfg.gradient_accumulation_steps);
  s.precision = s.cfg.precision();
  s.check_sampling();
  s.build(local_rank);
  try {
    s.start_or_resume();
  } catch (const Error& e) {
    s.engine->host_world().fail(e);  // the peers' waits end naming this rank's error
    throw;
  }
}

Trainer::~Trainer() = default;

// Forward and backward of the step's G micro-batches; returns this rank's sum of their losses
// (the last stage's with a pipeline). With a pipeline every stage reads the step's micro-batches
// (the first uses the inputs, the last the targets), ZeRO sees each backward event as a
// micro-batch, and *bubble gets the share of the schedule's time this stage idled.
Trainer::Impl::LossSums Trainer::Impl::micro_batches(int64_t step, double grad_scale, double* bubble,
                                                    StepClock& clock) {
  const auto scale = static_cast<float>(grad_scale);
  if (pp() > 1) return pipeline_micro_batches(step, scale, bubble, clock);
  if (graph) return graph_micro_batches(scale, clock);
  parallel::ZeroEngines zero(engine->zeros());
  const bool kill_here = step == opt.kill_at_step && rank == opt.kill_rank;
  Model& model = engine->model();
  Activations& acts = engine->activations();
  const auto& part = model.part();
  LossSums sums;
  const bool keep_losses = cfg.training.sync_loss_once;  // one copy back per step, after the loop
  // Decoder::forward_backward's pieces, with a lap after each phase (step_clock.h).
  for (int g = 0; g < G; ++g) {
    load(0, [&](int32_t* in, int32_t* tg) { loader->next(in, tg); });
    clock.lap(Phase::kData);
    zero.begin_micro_batch(g == G - 1, true);
    model.embed_forward(acts, mb_inputs(0));
    model.blocks_forward(acts, part.layer_begin, part.layer_end);
    clock.lap(Phase::kForward);
    if (keep_losses) model.head_forward_backward_deferred(acts, mb_targets(0), scale);
    else sums.loss += model.head_forward_backward(acts, mb_targets(0), scale);
    sums.aux += acts.router.load_balancing_loss();
    model.blocks_backward(acts, part.layer_begin, part.layer_end);
    model.embed_backward(acts, mb_inputs(0));
    clock.lap(Phase::kBackward);
    if (kill_here && g == 0) ::raise(SIGKILL);
    zero.end_micro_batch();
    clock.lap(Phase::kReduce);
  }
  if (keep_losses) {
    for (float l : model.take_losses()) sums.loss += l;  // in micro-batch order: the same sum
    clock.lap(Phase::kBackward);
  }
  return sums;
}

void Trainer::Impl::start_graph(parallel::EngineSpec& spec) {
  const std::string key = fmt::format("{}: $.training.cuda_graph", cfg.path);
  if (device != Device::kCuda || world > 1) {  // config_validate.h's check_cuda_graph says why
    throw invalid_argument("{}: a CUDA graph of the step needs one rank on training.device \"cuda\"", key);
  }
  if (masked) {
    throw invalid_argument("{}: a CUDA graph of the step: not with loss masks (the training data has them): each "
                           "step's loss divisor is its count of masked-in targets, an argument the graph would "
                           "replay unchanged",
                           key);
  }
  if (G > cuda::kLossSlots) {
    throw invalid_argument("{}: a CUDA graph of the step holds at most {} micro-batches (the device's loss slots); "
                           "gradient_accumulation_steps is {}",
                           key, cuda::kLossSlots, G);
  }
  graph = std::make_unique<StepGraph>();
  spec.model.cuda_stream = graph->stream();
  spec.zero.cuda_stream = graph->stream();
}

Trainer::Impl::LossSums Trainer::Impl::graph_micro_batches(float scale, StepClock& clock) {
  // Into the pinned slots the graph's copies read: free, since the previous step's loss copy
  // waited for its replay.
  for (int g = 0; g < G; ++g) load(g, [&](int32_t* in, int32_t* tg) { loader->next(in, tg); });
  clock.lap(Phase::kData);
  parallel::ZeroEngines zero(engine->zeros());
  Model& model = engine->model();
  Activations& acts = engine->activations();
  const auto& part = model.part();
  // What the graph holds: every micro-batch's forward and backward, in stream order.
  auto record = [&] {
    for (int g = 0; g < G; ++g) {
      zero.begin_micro_batch(g == G - 1, true);
      model.embed_forward(acts, mb_inputs(g));
      model.blocks_forward(acts, part.layer_begin, part.layer_end);
      model.head_forward_backward_deferred(acts, mb_targets(g), scale);
      model.blocks_backward(acts, part.layer_begin, part.layer_end);
      model.embed_backward(acts, mb_inputs(g));
      zero.end_micro_batch();
    }
  };
  if (!graph_warm) {
    record();  // eagerly: the first step makes every lazy allocation (cuBLAS, the loss slots)
    graph_warm = true;
  } else {
    if (!graph->captured_for(scale)) {
      graph->capture(scale, record);
      model.drop_kept_losses();  // queued, not run
      if (rank == 0) {
        spdlog::info("training.cuda_graph: the step's {} micro-batch(es) captured as a CUDA graph of {} nodes "
                     "(capture {}, loss scale {})",
                     G, graph->nodes(), graph->captures(), scale);
      }
    }
    graph->replay();
    model.keep_replayed_losses(G);
  }
  LossSums sums;
  for (float l : model.take_losses()) sums.loss += l;  // in micro-batch order, as micro_batches sums them
  clock.lap(Phase::kBackward);  // forward and backward in one graph: timed as the backward
  return sums;
}

// With a pipeline every stage reads the step's micro-batches (the first uses the inputs, the last
// the targets), ZeRO sees each backward event as a micro-batch, and *bubble gets the share of the
// schedule's time this stage idled. Time outside the compute events is the pipeline's wait.
Trainer::Impl::LossSums Trainer::Impl::pipeline_micro_batches(int64_t step, float scale, double* bubble,
                                                             StepClock& clock) {
  parallel::ZeroEngines zero(engine->zeros());
  const bool kill_here = step == opt.kill_at_step && rank == opt.kill_rank;
  std::vector<parallel::MicroBatch> mbs;
  for (int g = 0; g < G; ++g) {
    load(g, [&](int32_t* in, int32_t* tg) { loader->next(in, tg); });
    mbs.push_back({mb_inputs(g), mb_targets(g)});
  }
  clock.lap(Phase::kData);
  parallel::TiedEmbeddingHooks* tied = engine->tied_hooks();
  parallel::RunOptions ro;
  ro.grad_scale = scale;
  if (tied) ro.wte_grad = tied->wte_grad();
  ro.before_event = [&](const parallel::Event& e) {
    clock.lap(Phase::kPipeline);
    if (e.kind == parallel::EventKind::kBackward) zero.begin_micro_batch(e.mb == G - 1, true);
  };
  ro.after_event = [&](const parallel::Event& e) {
    const bool backward = e.kind == parallel::EventKind::kBackward;
    clock.lap(backward ? Phase::kBackward : Phase::kForward);
    if (!backward) return;
    if (kill_here && e.mb == 0) ::raise(SIGKILL);
    zero.end_micro_batch();
    clock.lap(Phase::kReduce);
  };
  const auto res = engine->stage()->run_schedule(engine->events(), mbs, ro);
  clock.lap(Phase::kPipeline);
  LossSums sums;
  for (float l : res.losses) sums.loss += l;
  for (double l : res.aux_losses) sums.aux += l;
  *bubble = res.seconds > 0 ? 1.0 - res.compute_seconds / res.seconds : 0.0;
  if (tied) {  // the tied wte gradient, summed over both stages, joins ZeRO's reduction
    zero.begin_micro_batch(true, true);
    tied->hand_over();
    zero.end_micro_batch();
    clock.lap(Phase::kReduce);
  }
  return sums;
}

// The mean validation loss over every data-parallel rank's eval_steps micro-batches. With a
// pipeline the micro-batches go through the stages G at a time (the token workspace's room).
double Trainer::Impl::evaluate() {
  // Evaluation: no dropout (LoRA's), training again after.
  const EvalMode eval_mode(engine->model());
  parallel::ZeroEngines zero(engine->zeros());
  val_loader->begin();
  const int64_t steps = val_loader->eval_steps();
  // With loss masks: each micro-batch's sum of token losses and its counted targets, so the result is
  // (sum of counted losses) / (counted targets) over every rank's rows.
  const bool val_masked = val_loader->has_mask();
  const double rows = static_cast<double>(B) * Tl;
  double sum = 0, counted = 0;
  auto count_targets = [&](int g) {
    const int32_t* t = mb_targets(g);
    for (int64_t i = 0; i < static_cast<int64_t>(B) * Tl; ++i) counted += t[i] != -1 ? 1 : 0;
  };
  for (int64_t i = 0; i < steps; i += pp() == 1 ? 1 : G) {
    if (pp() == 1) {
      load(0, [&](int32_t* in, int32_t* tg) { val_loader->next(in, tg); });
      count_targets(0);
      zero.begin_micro_batch(false, false);
      const double l = engine->model().forward(engine->activations(), mb_inputs(0), mb_targets(0));
      sum += val_masked ? l * rows : l;
      zero.end_micro_batch();
      continue;
    }
    const int k = static_cast<int>(std::min<int64_t>(G, steps - i));
    std::vector<parallel::MicroBatch> mbs;
    for (int g = 0; g < k; ++g) {
      load(g, [&](int32_t* in, int32_t* tg) { val_loader->next(in, tg); });
      count_targets(g);
      mbs.push_back({mb_inputs(g), mb_targets(g)});
    }
    zero.begin_micro_batch(false, false);
    for (float l : engine->stage()->evaluate(mbs).losses) sum += val_masked ? l * rows : l;
    zero.end_micro_batch();
  }
  if (val_masked) {
    const auto t = engine->host_world().sum_in_rank_order({loss_owner() ? sum : 0.0, loss_owner() ? counted : 0.0});
    return t[1] > 0 ? t[0] / t[1] : 0.0;
  }
  const double total = engine->host_world().sum_in_rank_order({loss_owner() ? sum : 0.0})[0];
  return total / static_cast<double>(steps * dp() * cp);
}

// Every row goes to one data-parallel rank (contiguous shares); each rank runs the same number
// of micro-batches of B rows (ZeRO-3 gathers and tensor-parallel regions are collective), the last
// ones padded. The loss owners' per-row sums (each cp rank's over its positions) are summed over
// the world.
std::vector<RowScore> Trainer::Impl::score_rows(const std::vector<const EvalRow*>& rows) {
  const int64_t R = static_cast<int64_t>(rows.size());
  const int64_t per_rank = (R + dp() - 1) / dp();
  const int64_t r0 = engine->coord().dp * per_rank, r1 = std::min(R, r0 + per_rank);
  const int64_t mbs = (per_rank + B - 1) / B;
  const size_t BT = static_cast<size_t>(B) * T, BTl = static_cast<size_t>(B) * Tl;
  auto row_at = [&](int64_t mb, int b) -> const EvalRow* {
    const int64_t r = r0 + mb * B + b;
    return r < r1 ? rows[static_cast<size_t>(r)] : nullptr;
  };
  std::vector<double> sums(2 * static_cast<size_t>(R), 0.0);
  std::vector<float> losses(BT);
  std::vector<uint8_t> top(BT);
  // This rank's (B, Tl) losses and flags of micro-batch `mb` into the rows' sums, by global position.
  auto collect = [&](int64_t mb, const float* l, const uint8_t* t) {
    if (!loss_owner()) return;
    if (cp == 1) {
      std::copy_n(l, BT, losses.begin());
      std::copy_n(t, BT, top.begin());
    } else {
      std::fill(losses.begin(), losses.end(), 0.0f);
      std::fill(top.begin(), top.end(), uint8_t{1});
      for (int b = 0; b < B; b++) {
        for (const auto& run : runs) {
          const size_t from = static_cast<size_t>(b) * Tl + run.local, to = static_cast<size_t>(b) * T + run.global;
          std::copy_n(l + from, run.length, losses.begin() + static_cast<std::ptrdiff_t>(to));
          std::copy_n(t + from, run.length, top.begin() + static_cast<std::ptrdiff_t>(to));
        }
      }
    }
    for (int b = 0; b < B; b++) {
      const EvalRow* row = row_at(mb, b);
      if (row == nullptr) continue;
      const RowScore rs = score_eval_row(*row, losses.data() + static_cast<size_t>(b) * T,
                                         top.data() + static_cast<size_t>(b) * T);
      const size_t i = 2 * static_cast<size_t>(r0 + mb * B + b);
      sums[i] += rs.loss;
      sums[i + 1] += rs.misses;
    }
  };
  auto fill = [&](int64_t mb) {
    return [&, mb](int32_t* in, int32_t* tg) {
      for (int b = 0; b < B; b++) fill_eval_row(row_at(mb, b), T, in + static_cast<size_t>(b) * T, tg + static_cast<size_t>(b) * T);
    };
  };
  parallel::ZeroEngines zero(engine->zeros());
  for (int64_t m = 0; m < mbs; m += pp() == 1 ? 1 : G) {
    if (pp() == 1) {
      load(0, fill(m));
      Activations& a = engine->activations();
      a.record_top = true;
      zero.begin_micro_batch(false, false);
      engine->model().forward(a, mb_inputs(0), mb_targets(0));
      zero.end_micro_batch();
      a.record_top = false;
      collect(m, a.host_losses.data(), a.target_is_top.data());
      continue;
    }
    const int k = static_cast<int>(std::min<int64_t>(G, mbs - m));
    std::vector<parallel::MicroBatch> batch;
    for (int g = 0; g < k; ++g) {
      load(g, fill(m + g));
      batch.push_back({mb_inputs(g), mb_targets(g)});
    }
    zero.begin_micro_batch(false, false);
    const auto res = engine->stage()->evaluate(batch, /*record_top=*/true);
    zero.end_micro_batch();
    for (int g = 0; g < k && !res.token_losses.empty(); ++g) {
      collect(m + g, res.token_losses.data() + g * BTl, res.target_is_top.data() + g * BTl);
    }
  }
  const std::vector<double> total = engine->host_world().sum_in_rank_order(sums);
  std::vector<RowScore> out(static_cast<size_t>(R));
  for (size_t r = 0; r < out.size(); ++r) out[r] = {total[2 * r], total[2 * r + 1]};
  return out;
}

std::vector<TaskScore> Trainer::Impl::evaluate_tasks() {
  const EvalMode eval_mode(engine->model());
  std::vector<TaskScore> out;
  for (const EvalTask& task : eval_tasks) out.push_back(summarize_task(task, score_rows(task.row_list())));
  return out;
}

void Trainer::Impl::record_peaks(StepRecord& r) {
  record_memory_peaks(r, alloc.stats(), opt.metrics_all_ranks ? &engine->host_world() : nullptr);
}

void Trainer::Impl::note_planned_memory(StepRecord& r, MetricsReporter& reporter) {
  note_plan_beside_peaks(r, reporter, cfg, rank);
}

// training.sample_interval samples from rank 0's model, so rank 0 must hold all of it.
void Trainer::Impl::check_sampling() {
  if (cfg.training.sample_interval <= 0) return;
  if (cfg.tensor_parallel.size > 1 || pp() > 1 || cfg.zero.stage == 3 || cfg.expert_parallel.size > 1) {
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("{}: $.training.sample_interval: samples need the whole model on rank 0, but this layout "
                            "splits it (tensor_parallel.size {}, pipeline.stages {}, ZeRO stage {}, "
                            "expert_parallel.size {})",
                            cfg.path, cfg.tensor_parallel.size, pp(), cfg.zero.stage, cfg.expert_parallel.size),
                "sample from a checkpoint instead: dstrain sample --checkpoint DIR");
  }
  const auto spec = config_tokenizer(cfg);
  codec = codec_for(cfg.model.shape.vocab_size, spec ? &*spec : nullptr);
}

// llm.c's sample: 64 tokens from a newline at temperature 1, a seed per step.
void Trainer::Impl::print_sample(int64_t step, MetricsReporter& reporter) {
  Model& model = engine->model();
  std::vector<float> params(static_cast<size_t>(model.num_params()));
  kern::typed::to_host_f32(params.data(), model.params(), model.num_params());
  GenerateOptions o;
  o.tokens = 64;
  o.seed = cfg.training.seed + static_cast<uint64_t>(step);
  if (shape.lora.on()) {  // the generator runs plain models: the adapters merged, W + (alpha/r) B A
    params = merge_lora(shape, params.data());
    reporter.note(fmt::format("sample at step {}:\n---\n{}\n---", step,
                              generate_text(lora_base_shape(shape), params.data(), *codec, o)));
    return;
  }
  reporter.note(fmt::format("sample at step {}:\n---\n{}\n---", step, generate_text(shape, params.data(), *codec, o)));
}

std::string Trainer::Impl::describe_run() const { return describe_training(cfg, engine->zero().stage()); }

// One optimizer step: the micro-batches' forward and backward, the global statistics and the
// update (step_math.h). Returns its record without the peaks and the validation loss.
StepRecord Trainer::Impl::train_step(int64_t step, const UpdateSettings& settings, bool* preempt_after_step) {
  const auto t0 = Clock::now();
  const uint64_t sent0 = comm::bytes_sent_by_this_process();
  const double global_micro_batches = static_cast<double>(G) * dp();
  parallel::ZeroEngines zero(engine->zeros());
  StepClock clock(&zero.dense(), engine->cp_hooks(), engine->ep_hooks());
  zero.begin_step();
  for (OptimizerState* st : optimizer_states()) st->begin_step();  // local gradients (the 1-bit optimizers)?
  if (auto* tied = engine->tied_hooks()) tied->zero();
  const double loss_scale = scaler->scale();
  double bubble = -1;
  // A cp rank's gradients are of the mean over its rows; summed over dp x cp and scaled by
  // 1/(G dp cp) they are the gradients of the mean over the global batch (every rank holds Tl).
  // With loss masks each counted target's gradient is loss_scale / (the step's counted targets),
  // which every rank computes from the masks of the step's G x dp windows (docs/training.md).
  double step_counted = 0;
  if (masked) {
    step_counted = static_cast<double>(loader->step_counted_targets(loader->micro_step()));
    engine->model().set_loss_divisor(step_counted > 0 ? step_counted / (global_micro_batches * cp) : 1.0);
  }
  const LossSums sums = micro_batches(step, loss_scale / (global_micro_batches * cp), &bubble, clock);
  const std::vector<OptimizerPart> parts = optimizer_parts();
  if (step == opt.inject_inf_at_step && state->opt_begin() == 0 && state->opt_count() > 0) {
    const float inf = std::numeric_limits<float>::infinity();
    kern::typed::from_host_f32(parts.front().grads, &inf, 1);
  }
  const bool owner = loss_owner();
  // Masked: the owners' sums of token losses (each micro-batch's mean x its B x Tl rows) over the count.
  const double owned_loss = !owner ? 0.0 : masked ? sums.loss * B * Tl : sums.loss / cp;
  const StepStats stats = global_step_stats(engine->host_world(), owned_loss, parts, global_micro_batches, loss_scale,
                                            preempt::requested(), owner ? sums.aux / cp : 0.0,
                                            masked ? std::max(step_counted, 1.0) : 0.0,
                                            cfg.training.sync_norm_once);
  clock.lap(Phase::kStats);
  *preempt_after_step = stats.preempt;
  StepRecord r;
  r.lr = schedule->lr();
  // training.skip_spikes: an outlier loss or norm skips the update (every rank decides alike).
  const std::string spike = spikes && !stats.overflow ? spikes->judge(stats.loss, stats.grad_norm) : std::string();
  if (!spike.empty()) {
    r.skipped = true;
    if (rank == 0) spdlog::warn("step {}: {}: the update is skipped (training.skip_spikes)", step, spike);
  } else {
    r.skipped = apply_update(step, stats, loss_scale, r.lr, settings, parts, *scaler, *schedule);
  }
  if (spikes) r.extra["skipped_spikes"] = static_cast<double>(spikes->skipped());
  clock.lap(Phase::kOptimizer);
  r.ms_per_step = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  if (cfg.wall_clock_breakdown) {
    r.breakdown = clock.finish();
    if (stragglers) report_stragglers(*r.breakdown, step, r);
  }
  r.step = step;
  r.total_steps = cfg.training.steps;
  r.loss = stats.loss;
  if (moe) r.aux_loss = stats.aux_loss;
  r.grad_norm = stats.grad_norm;
  r.loss_scale = loss_scale;
  const double tokens = static_cast<double>(B) * T * global_micro_batches;
  r.tokens_per_s = tokens / (r.ms_per_step / 1000.0);
  const StepFlops f = step_flops(flops_per_token, tokens, r.ms_per_step / 1000.0, world, peak.tflops);
  r.tflops = f.tflops;
  if (peak.tflops > 0) r.mfu = f.mfu;
  if (bubble >= 0) r.extra["pipeline_bubble"] = bubble;  // rank 0's: the first stage's
  if (masked) {  // loss masks: the targets that counted in this step, and their rate
    r.extra["counted_tokens"] = step_counted;
    r.extra["counted_tokens_per_s"] = step_counted / (r.ms_per_step / 1000.0);
  }
  // This rank's bytes through the collectives of this step (comm/comm.h's ring count).
  r.extra["comm_bytes_sent"] = comm::bytes_sent_by_this_process() - sent0;
  return r;
}

void Trainer::Impl::report_stragglers(const StepBreakdown& b, int64_t step, StepRecord& r) {
  std::vector<double> mine(static_cast<size_t>(world), 0.0);
  mine[static_cast<size_t>(rank)] = b[Phase::kForward] + b[Phase::kBackward];
  const std::vector<double> all = engine->host_world().sum_in_rank_order(mine);
  for (int q = 0; q < world; ++q) r.extra[fmt::format("time_compute_ms_rank{}", q)] = all[static_cast<size_t>(q)];
  for (const std::string& line : stragglers->observe(all)) {
    if (rank == 0) spdlog::warn("step {}: straggler: {}", step, line);
  }
}

TrainResult Trainer::run() {
  Impl& s = *impl_;
  TrainResult result;
  result.first_step = s.next_step;
  const auto& tc = s.cfg.training;
  const int64_t stop = s.opt.max_steps >= 0 ? std::min(tc.steps, s.opt.max_steps) : tc.steps;
  MetricsReporter reporter(s.rank == 0, s.opt.metrics_path, s.next_step > 1, tc.log_interval);
  if (s.next_step == 1) {
    reporter.note(s.describe_run());
    reporter.note(s.peak.tflops > 0 ? fmt::format("MFU against {:.4g} TFLOP/s per rank ({}); model FLOPs {:.4g} per token",
                                                  s.peak.tflops, s.peak.source, s.flops_per_token)
                                    : fmt::format("MFU not reported: {}", s.peak.source));
  }
  const UpdateSettings settings = update_settings_of(s.cfg);
  s.alloc.reset_peaks();
  // bf16 on a GPU stores bf16 buffers, whose products are bf16 GEMMs with fp32 accumulation
  // (cuda::typed); no fp32 product is left for cuda::MatmulMath to change.
  const kern::DeviceScope device_scope(s.device);
  try {
    if (s.rank == 0) reporter.add_monitors(open_monitors(s.cfg, s.next_step > 1), s.cfg.train_batch_size, s.cfg.fp16.enabled);
    s.run_steps(stop, settings, reporter, result);
  } catch (const Error& e) {
    s.engine->host_world().fail(e);  // the peers' waits end naming this rank's error
    throw;
  }
  return result;
}

void Trainer::Impl::run_steps(int64_t stop, const UpdateSettings& settings, MetricsReporter& reporter,
                              TrainResult& result) {
  Impl& s = *this;
  const auto& tc = s.cfg.training;
  for (int64_t step = s.next_step; step <= stop; ++step) {
    bool preempt_after_step = false;
    StepRecord r = s.train_step(step, settings, &preempt_after_step);
    s.elastic.add_to(r);
    s.record_peaks(r);
    const bool eval_step = tc.eval_interval > 0 && (step % tc.eval_interval == 0 || step == tc.steps);
    if (s.val_loader && eval_step) {
      r.val_loss = s.evaluate();
      result.last_val_loss = r.val_loss;
    }
    if (!s.eval_tasks.empty() && eval_step) {
      std::string line;
      for (const TaskScore& score : s.evaluate_tasks()) {
        for (const auto& [name, value] : task_metrics(score)) {
          r.extra[name] = value;
          line += fmt::format("{}{} {:.4f}", line.empty() ? "" : ", ", name, value);
        }
      }
      reporter.note(fmt::format("eval at step {}: {}", step, line));
    }
    if (step == result.first_step) {
      s.note_planned_memory(r, reporter);
      if (s.device == Device::kCpu) reporter.note("CPU kernels: " + cpu::kernel_report());
    }
    const bool has_dir = !tc.checkpoint_dir.empty();
    const bool saved =
        has_dir && tc.checkpoint_interval > 0 && (step % tc.checkpoint_interval == 0 || step == tc.steps);
    // Preemption (common/preemption.h): every rank saw the same flag in the step's sums, so every
    // rank stops after this step, with a checkpoint of it.
    const bool preempted = preempt_after_step && step < stop;
    auto run = s.checkpointed();
    if (s.async_ckpt && (saved || (preempted && has_dir))) {
      // The wait for the previous write is this step's; the write itself goes on behind training.
      const double waited = s.async_ckpt->save(run, step);
      r.extra["checkpoint_wait_ms"] = waited;
      reporter.note(fmt::format("async checkpoint of step {}: waited {:.1f} ms for the previous write", step, waited));
    }
    reporter.report(r);
    if (s.codec && s.rank == 0 && step % tc.sample_interval == 0) s.print_sample(step, reporter);
    result.losses.push_back(r.loss);
    result.last_step = step;
    s.next_step = step + 1;
    if (saved && !s.async_ckpt) save_checkpoint(run, step);
    if (preempted) {
      if (has_dir && !saved && !s.async_ckpt) save_checkpoint(run, step);
      result.preempted = true;
      result.checkpoint_written = has_dir;
      break;
    }
  }
  // The last write committed before the run returns: at the end, on preemption and before an
  // exit the caller chose (--max-steps). A failure of it stops the job here.
  if (s.async_ckpt) {
    const double waited = s.async_ckpt->flush();
    reporter.note(fmt::format("async checkpoint flushed (waited {:.1f} ms for the last write)", waited));
  }
}

void Trainer::export_llmc(const std::string& path, bool bf16) {
  Impl& s = *impl_;
  write_llmc_export(path, *s.engine, s.optimizer_states(), s.cfg.pipeline.partition, s.alloc, s.device, bf16);
}

void Trainer::export_adapter(const std::string& dir, const std::string& dtype) {
  Impl& s = *impl_;
  const ckpt::StDtype d = dtype == "bf16" ? ckpt::StDtype::kBF16 : dtype == "fp16" ? ckpt::StDtype::kF16
                                                                                   : ckpt::StDtype::kF32;
  write_adapter_export(dir, *s.engine, s.optimizer_states(), s.cfg.pipeline.partition, s.alloc, s.device, d,
                       s.cfg.lora.target_modules, s.cfg.model.init_from);
}

void Trainer::export_safetensors(const std::string& dir, const std::string& dtype) {
  Impl& s = *impl_;
  const ckpt::StDtype d = dtype == "bf16" ? ckpt::StDtype::kBF16 : dtype == "fp16" ? ckpt::StDtype::kF16
                                                                                   : ckpt::StDtype::kF32;
  write_safetensors_export(dir, *s.engine, s.optimizer_states(), s.cfg.pipeline.partition, s.alloc, s.device, d);
}

int64_t Trainer::step_in_progress() const { return impl_->next_step; }

}  // namespace ds::rt::train
