// A model family described once: the block recipe the one decoder (runtime/model/decoder.h) runs,
// where each of a layer's roles sits in the family's parameter table, and the family's tensor and
// activation lists. Code outside model_spec and the model asks this description instead of
// switching on a family name; a new family is one more entry here (family.cpp) plus its
// parameter and activation lists and the kernels it needs, if any.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model_spec/shape.h"

namespace ds::model_spec {

enum class NormKind { kLayerNorm, kRmsNorm };  // LayerNorm: weight and bias, mean and rstd kept
enum class PositionKind { kLearned, kRope };   // learned: a position embedding (wpe) added once
// GELU: up (H), gelu, down; SwiGLU: gate|up (2H), silu*up, down; MoE: a router picks k of E SwiGLU
// experts per token (up_w / down_w are the stacked experts' w13 / w2, router_w the gate).
enum class MlpKind { kGelu, kSwiGlu, kMoe };

// The ParamIds of one layer's tensors by the role they play in the block, and of the final norm;
// nullopt where the family has no such tensor (biases, a RMSNorm's bias). qkv_w is the first of
// the q, k, v rows (adjacent in the flat layout, one matmul); up_w likewise the first of gate|up.
struct LayerRoles {
  ParamId norm1_w;
  std::optional<ParamId> norm1_b;
  ParamId qkv_w;
  std::optional<ParamId> qkv_b;
  ParamId proj_w;
  std::optional<ParamId> proj_b;
  ParamId norm2_w;
  std::optional<ParamId> norm2_b;
  ParamId up_w;
  std::optional<ParamId> up_b;
  ParamId down_w;
  std::optional<ParamId> down_b;
  ParamId final_norm_w;
  std::optional<ParamId> final_norm_b;
  std::optional<ParamId> router_w;  // MoE: the router (E, C)
};

// One config.json key of a Hugging Face model and its value as JSON text ("4096", "1e-05",
// "\"silu\"", "false").
struct HfConfigKey {
  std::string key;
  std::string json;
};

// A config.json key an import checks against the model: present and equal to `json` (numbers
// compared as numbers), or, when not `required`, possibly absent (transformers then takes its
// default, which is `json`). `model_key` names what it must agree with ("model.seq_len").
// `at_least`: a number >= `json` (n_positions: a longer position table's first rows are read).
struct HfConfigCheck {
  std::string key;
  std::string json;
  bool required;
  std::string model_key;
  bool at_least = false;
};

// How Hugging Face stores the family: transformers' class and model_type, each tensor copy's name
// (layer -1 for global tensors), and config.json's keys beside architectures, model_type and
// torch_dtype. Import and export (runtime/checkpoint/hf_safetensors.h) read only this.
// A stacked tensor (Mixtral's experts) is several HF tensors: `pieces` equal blocks of its rows,
// piece p named tensor_name(id, layer, p) (null `pieces`: one piece each).
struct HfFormat {
  const char* architecture;  // "LlamaForCausalLM"
  const char* model_type;    // "llama"
  std::string (*tensor_name)(ParamId id, int layer, int piece);
  std::vector<HfConfigKey> (*config)(const ModelShape& s);
  int (*pieces)(ParamId id, const ModelShape& s) = nullptr;
  // HF stores the (out, in) matrix transposed, as (in, out): GPT-2's Conv1D. Null: none is.
  bool (*transposed)(ParamId id) = nullptr;
  // Names in HF's files that are no weights (GPT-2's causal-mask buffers attn.bias and
  // attn.masked_bias in old files): skipped on import. Null: none.
  bool (*ignored)(std::string_view name) = nullptr;
  // The prefix the base model's files leave off ("transformer." of GPT2LMHeadModel, which
  // GPT2Model's files lack): a file none of whose names starts with it is read without it. Null: none.
  const char* base_prefix = nullptr;
  // The config.json keys an import checks (then the config.json beside the weights is required).
  // Null: an import does not read config.json.
  std::vector<HfConfigCheck> (*import_checks)(const ModelShape& s) = nullptr;
};
int hf_pieces(const HfFormat& hf, ParamId id, const ModelShape& s);
bool hf_transposed(const HfFormat& hf, ParamId id);

// How a shape rule names what it checks. The config reports "n_kv_head (3) must divide n_head
// (4)" at $.model.n_kv_head (kConfigRuleNames); ModelShape::validate throws "model.n_kv_head (3)
// must divide model.n_head (4)" (kShapeRuleNames).
struct RuleNames {
  const char* key_prefix;  // before every model key a message names
  const char* tp;          // what the tensor-parallel size is called
};
inline constexpr RuleNames kShapeRuleNames{"model.", "the tensor-parallel size"};
inline constexpr RuleNames kConfigRuleNames{"", "tensor_parallel.size"};
// A broken shape rule: the model key it is about and what is wrong.
struct RuleError {
  std::string key;
  std::string message;
};
using RuleErrors = std::vector<RuleError>;

// One of a family's own config keys (model.<key>, beyond the keys every family has: type,
// n_layer, n_head, n_embd, vocab_size, padded_vocab_size, seq_len, init_from), and the ModelShape
// field it fills. The config reads it for the families that list it, refuses it (naming the
// families that have it) for the others, and writes it back; the calibration file records it.
struct FamilyKey {
  enum class Kind { kInt, kNumber, kBool };
  const char* key;
  Kind kind;
  bool required;     // absent: an error naming the family and `what`; else ModelShape's default
  const char* what;  // "the SwiGLU width"
  int ModelShape::*int_field = nullptr;        // kInt, in [lo, hi]
  double ModelShape::*number_field = nullptr;  // kNumber, in (lo, hi]
  bool ModelShape::*bool_field = nullptr;      // kBool
  double lo = 0, hi = 0;
  bool lo_open = true;  // kNumber: (lo, hi] when open, else [lo, hi]
};
FamilyKey int_key(const char* key, int ModelShape::*field, bool required, const char* what);
FamilyKey number_key(const char* key, double ModelShape::*field, double lo_open, double hi, const char* what);
FamilyKey nonnegative_key(const char* key, double ModelShape::*field, const char* what);  // [0, inf)
FamilyKey bool_key(const char* key, bool ModelShape::*field, const char* what);

struct FamilyDescription {
  ModelFamily family;
  const char* name;          // "gpt2", "llama": config's model.type
  const char* display_name;  // "GPT-2", "Llama": in logs and reports
  NormKind norm;
  PositionKind positions;
  MlpKind mlp;
  bool grouped_query;     // reads model.n_kv_head (else KV = NH)
  bool head_always_tied;  // the lm_head is the token embedding whatever model.tie_embeddings says
  LayerRoles roles;
  std::vector<ParamTensor> (*params)(const ModelShape&);
  std::vector<ActBuffer> (*activations)(const ModelShape&, const ModelPart&, const ActConfig&);
  std::vector<FamilyKey> keys;  // its own config keys
  int vocab_multiple;           // padded_vocab_size's default: vocab_size rounded up to a multiple of it
  int max_vocab_size;           // the largest vocab_size the config accepts
  void (*resolve)(ModelShape&);  // fills the defaults that depend on other keys; null: none
  // Its own shape rules, and what tensor parallelism of size tp must divide: each broken rule
  // appended to `out`, named as `names` says. Null: none.
  void (*check)(const ModelShape&, const RuleNames& names, RuleErrors& out);
  void (*check_tp)(const ModelShape&, int tp, const RuleNames& names, RuleErrors& out);
  bool llmc_checkpoint;  // llm.c's checkpoint format holds it (--init-from FILE.bin, --export-llmc)
  const HfFormat* hf;    // Hugging Face's safetensors and config.json; null: none
};

const FamilyDescription& family_of(ModelFamily f);
// The family's shape rules that `s` breaks, and those tensor parallelism of size tp breaks
// (ModelShape::validate and validate_tp throw the first; the config reports each at its key).
RuleErrors family_rule_errors(const ModelShape& s, const RuleNames& names = kShapeRuleNames);
RuleErrors family_tp_rule_errors(const ModelShape& s, int tp, const RuleNames& names = kShapeRuleNames);
// Every registered family, in registration order.
const std::vector<const FamilyDescription*>& all_families();
// The family whose name (config's model.type) is `name`; null when none is.
const FamilyDescription* find_family(std::string_view name);
// The family llm.c's checkpoint file holds (the one with llmc_checkpoint).
const FamilyDescription& llmc_family();
// "gpt2, llama": for messages listing what model.type accepts.
std::string family_names();
// "GPT-2 L=12 NH=12 C=768 V=50257 (Vp 50304) T=1024" plus the family's own sizes (KV and I for a
// grouped-query SwiGLU family, and "tied" when its head is tied by choice): one line for reports.
std::string describe_shape(const ModelShape& s);
inline const FamilyDescription& family_of(const ModelShape& s) { return family_of(s.family); }

// Key/value heads (NH for a multi-head family) and the MLP's hidden width H (4C for GELU, I for
// SwiGLU), whole model.
int kv_heads(const ModelShape& s);
int mlp_width(const ModelShape& s);

}  // namespace ds::model_spec
