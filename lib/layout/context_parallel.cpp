// Context parallelism's positions, rules and scratch sizes (context_parallel.h).
#include "layout/context_parallel.h"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

namespace ds::layout {

const char* cp_method_name(CpMethod m) { return m == CpMethod::kRing ? "ring" : "ulysses"; }

std::optional<CpMethod> parse_cp_method(std::string_view text) {
  std::string s(text);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (s == "ring") return CpMethod::kRing;
  if (s == "ulysses") return CpMethod::kUlysses;
  return std::nullopt;
}

std::vector<PositionRun> cp_position_runs(int T, int n, int r, CpMethod m) {
  if (n == 1) return {{0, 0, T}};
  if (m == CpMethod::kUlysses) return {{0, r * (T / n), T / n}};
  const int C = T / (2 * n);
  return {{0, r * C, C}, {C, (2 * n - 1 - r) * C, C}};
}

std::optional<std::string> cp_sequence_rule(int T, int n, CpMethod m) {
  if (n == 1) return std::nullopt;
  const int d = m == CpMethod::kRing ? 2 * n : n;
  if (T % d == 0) return std::nullopt;
  return m == CpMethod::kRing
             ? fmt::format("the sequence length {} is not divisible by 2 x context_parallel.size = {} (the ring "
                           "gives each rank two equal chunks)",
                           T, d)
             : fmt::format("the sequence length {} is not divisible by context_parallel.size {} (Ulysses gives each "
                           "rank an equal part)",
                           T, n);
}

std::optional<std::string> cp_heads_rule(int NH, int KV, int tp, int n, CpMethod m) {
  if (n == 1 || m != CpMethod::kUlysses) return std::nullopt;
  const int nh = NH / tp, kv = KV / tp;
  const char* per = tp > 1 ? " per tensor-parallel rank" : "";
  if (nh % n != 0) {
    return fmt::format("n_head: {} query heads{} are not divisible by context_parallel.size {} (Ulysses splits the "
                       "heads over the cp ranks; use method \"ring\", or a size that divides them)",
                       nh, per, n);
  }
  if (kv % n != 0) {
    return fmt::format("n_kv_head: {} key/value heads{} are not divisible by context_parallel.size {} (Ulysses "
                       "splits the heads over the cp ranks; use method \"ring\", or a size that divides them)",
                       kv, per, n);
  }
  return std::nullopt;
}

CpScratchBytes cp_attention_scratch(const CpAttentionShape& s) {
  if (s.n == 1) return {};
  return s.method == CpMethod::kRing ? ring_attention_scratch(s) : ulysses_attention_scratch(s);
}

CpScratchBytes ring_attention_scratch(const CpAttentionShape& s) {
  CpScratchBytes b;
  const int64_t sb = s.storage_bytes, hd = s.hd;
  const int64_t rows = static_cast<int64_t>(s.B) * (s.T / (2 * s.n));  // one chunk's rows
  const int64_t qkv = (s.NH + 2 * s.KV) * hd, out = s.NH * hd, kv = 2 * s.KV * hd;
  // The block kernels' per-thread fp32 tiles (cpu::attention_block_scratch_floats at Tq = Tk = a
  // chunk's T / 2n tokens): q, out, dout and D of one head, its k and v, two 64-row score tiles.
  const int64_t C = s.T / (2 * s.n);
  const int64_t tiles = 3 * C * hd + C + 2 * C * hd + 2 * 64 * C;
  b.workspace = cp_align_bytes(sb * rows * (2 * qkv + 4 * out)) + 4 * 3 * rows * (out + s.NH) +
                4 * static_cast<int64_t>(std::max(0, s.num_threads)) * tiles;
  b.comm = cp_align_bytes(sb * 4 * rows * kv) + 4 * 4 * rows * kv;
  return b;
}

CpScratchBytes ulysses_attention_scratch(const CpAttentionShape& s) {
  CpScratchBytes b;
  const int64_t sb = s.storage_bytes, hd = s.hd;
  const int64_t NHn = s.NH / s.n, KVn = s.KV / s.n, T = s.T;
  const int64_t nqkv = s.B * T * (NHn + 2 * KVn) * hd, nout = s.B * T * NHn * hd;
  const int64_t per_thread = 2 * T * T + (sb == 4 ? 0 : 8 * T * hd);
  b.workspace = cp_align_bytes(sb * (2 * nqkv + 2 * nout)) + 4 * static_cast<int64_t>(std::max(0, s.num_threads)) * per_thread;
  b.comm = 2 * sb * s.n * (s.B * (T / s.n) * (NHn + 2 * KVn) * hd);
  return b;
}

}  // namespace ds::layout
