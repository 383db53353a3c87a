// Context parallelism's shared arithmetic, for the config, the plan and the runtime: which
// positions of a sequence each rank of a cp group holds, the rules a layout must meet, and the
// scratch each attention method keeps (the runtime allocates exactly what the plan counts).
//
//   ring     (Megatron's context parallelism, torchtitan's CP): the sequence is cut into 2N
//            chunks of T/(2N) tokens and rank r holds chunks r and 2N-1-r, in that order (the
//            causal load balance: each rank has one early and one late chunk);
//   ulysses  (DeepSpeed-Ulysses): rank r holds the contiguous part [r T/N, (r+1) T/N).
//
// Deliberately pure arithmetic: the attentions themselves are runtime/parallel/ring_attention.h
// and ulysses_attention.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ds::layout {

enum class CpMethod { kRing, kUlysses };
const char* cp_method_name(CpMethod m);                         // "ring", "ulysses"
std::optional<CpMethod> parse_cp_method(std::string_view text);  // case-insensitive

// A run of consecutive positions a cp rank holds: local rows [local, local + length) are global
// positions [global, global + length).
struct PositionRun {
  int local = 0, global = 0, length = 0;
};
// Rank r's runs of a T-token sequence over n ranks (one run for Ulysses or n = 1, two for the
// ring). T must meet cp_sequence_rule.
std::vector<PositionRun> cp_position_runs(int T, int n, int r, CpMethod m);

// The divisibility the method needs of the sequence: 2n for the ring (two equal chunks per rank),
// n for Ulysses. nullopt when T meets it, else the reason ("... is not divisible by ...").
std::optional<std::string> cp_sequence_rule(int T, int n, CpMethod m);
// Ulysses splits heads: this tp rank's query heads and kv heads must divide by n. nullopt when
// they do (and always for the ring), else the reason, naming n_head or n_kv_head.
std::optional<std::string> cp_heads_rule(int NH, int KV, int tp, int n, CpMethod m);

// One attention's shape on a cp rank: B sequences of T tokens (the WHOLE sequence), this tp
// rank's NH query and KV key/value heads of hd, n cp ranks.
struct CpAttentionShape {
  int B = 1, T = 1, NH = 1, KV = 1, hd = 1, n = 1;
  CpMethod method = CpMethod::kRing;
  int storage_bytes = 4;  // the activations' element size
  int num_threads = 1;    // CPU threads (both keep per-thread tiles; 0 on a GPU)
};
// The scratch one cp attention keeps, allocated once and reused by every layer:
//   ring     workspace: the rank's q, and in backward its out and dout, gathered chunk-major
//            (storage type), the fp32 merge accumulators (output and lse, and one block's
//            partial result), and the block kernels' per-thread tiles (fp32: 5 C hd + C + 128 C
//            at C = T / 2n); comm: the key/value block in hand and the one arriving (storage
//            type) and the dK/dV accumulator in hand and arriving (fp32).
//   ulysses  workspace: qkv and out in the head layout over the whole sequence, and their
//            gradients (storage type), and the whole-sequence attention's per-thread tiles
//            (fp32: 2 T^2, + 8 T hd at 16 bits); comm: the all-to-all's send and receive pieces.
struct CpScratchBytes {
  int64_t workspace = 0, comm = 0;
};
// 0 at n = 1 (the model's own attention runs); the two below size their method at any n.
CpScratchBytes cp_attention_scratch(const CpAttentionShape& s);
CpScratchBytes ring_attention_scratch(const CpAttentionShape& s);
CpScratchBytes ulysses_attention_scratch(const CpAttentionShape& s);
// Where the fp32 part of a scratch starts after `bytes` of storage-typed elements: 64-aligned.
inline int64_t cp_align_bytes(int64_t bytes) { return (bytes + 63) / 64 * 64; }

}  // namespace ds::layout
