// Activation memory as Korthikanti et al. 2022 count it ("Reducing Activation Recomputation in
// Large Transformer Models", Table 2): bytes per transformer layer at 16 bits, for a micro-batch
// of b sequences of s tokens, hidden size h, a heads, tensor-parallel size t.
//   no parallelism:                       sbh (34 + 5as/h)
//   tensor parallel:                      sbh (10 + 24/t + 5as/(ht))
//   tensor + sequence parallel:           sbh (34/t + 5as/(ht))
//   tensor parallel + selective recompute:        sbh (10 + 24/t)
//   tensor + sequence parallel + selective:       sbh (34/t)
//   full recomputation:                   2 sbh   (only each layer's input is kept)
// The terms: 34 sbh = the 16-bit tensors of attention (11 sbh) and MLP (19 sbh) plus the two
// LayerNorms (4 sbh); 5as^2b = attention scores, softmax output (2 B each) and its dropout mask
// (1 B). With 1F1B the first pipeline stage keeps p micro-batches of L/p layers: L layers' worth.
// This is the paper's rule of thumb for Megatron-LM's kernels, offered for comparison; dstrain's
// own planner (memory_model.h) counts the buffers the runtime allocates (model_spec). Pure.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ds::plan {

enum class PaperRecompute { kNone, kSelective, kFull };

struct KorthikantiInput {
  double s = 0;  // sequence length
  double b = 1;  // micro-batch size
  double h = 0;  // hidden size
  double a = 0;  // attention heads
  double t = 1;  // tensor-parallel size
  bool sequence_parallel = false;
  PaperRecompute recompute = PaperRecompute::kNone;
};

// Bytes per layer on one GPU; throws ds::Error (invalid argument) on non-positive sizes,
// sequence parallelism without t > 1, or h or a not divisible by t.
double korthikanti_layer_bytes(const KorthikantiInput& in);

struct KorthikantiRow {
  std::string name;     // "tensor parallel + selective recompute"
  std::string formula;  // "sbh(10 + 24/t)"
  double layer_bytes = 0;
};
// The six rows of Table 2 for these sizes (sequence-parallel rows need t > 1 and are skipped
// at t = 1, where they equal the tensor-parallel ones).
std::vector<KorthikantiRow> korthikanti_table(double s, double b, double h, double a, double t);

// Table 2 at one set of sizes with the first pipeline stage under 1F1B: what `dstrain plan
// --formula paper` shows. The first of pp stages holds ceil(L / pp) layers and keeps pp
// micro-batches in flight, so it keeps stage_layers x pp layer activations (L layers' worth when
// pp divides L).
struct KorthikantiView {
  int64_t s = 0, b = 1, h = 0, a = 0, t = 1;
  int64_t layers = 0;  // L; 0 = not given (no first-stage figures)
  int64_t pp = 1;
  std::vector<KorthikantiRow> rows;  // korthikanti_table(s, b, h, a, t)
  int64_t stage_layers = 0;          // ceil(L / pp); 0 without L
  int64_t layer_micro_batches = 0;   // stage_layers x pp
};
// Throws what korthikanti_table throws.
KorthikantiView korthikanti_view(int64_t s, int64_t b, int64_t h, int64_t a, int64_t t,
                                 int64_t layers, int64_t pp);

}  // namespace ds::plan
