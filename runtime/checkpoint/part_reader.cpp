// Reading a part of a checkpoint for any layout (part_reader.h).
#include "checkpoint/part_reader.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "checkpoint/checkpoint_dir.h"
#include "common/check.h"
#include "common/error.h"
#include "layout/partition.h"
#include "layout/topology.h"

namespace ds::rt::ckpt {

namespace ms = ds::model_spec;

struct PartReader::ShardSet {
  struct Piece {
    int shard;
    int64_t begin, count;  // in the part's flat layout
    bool expert = false;   // a range of the expert region: the shard's "expert_<name>" tensors
  };
  std::string dir, where;
  std::vector<Piece> pieces;
  std::map<int, std::unique_ptr<ShardReader>> readers;

  ShardReader& reader(int q) {
    auto& rd = readers[q];
    if (!rd) rd = std::make_unique<ShardReader>(dir + "/" + shard_file_name(q));
    return *rd;
  }
  // Elements [lo, hi) of this old part's tensor `name` (of `dtype`, `elem` bytes each) into dst.
  void read(const std::string& name, const std::string& dtype, size_t elem, int64_t lo, int64_t hi, char* dst) {
    for (const auto& [q, b, c, expert] : pieces) {
      const auto r = layout::intersect(lo, hi, b, b + c);
      if (r.size() <= 0) continue;
      ShardReader& rd = reader(q);
      const std::string stored = expert ? "expert_" + name : name;
      if (!rd.has(stored)) throw invalid_argument("{}: shard {} has no tensor '{}'", where, shard_file_name(q), stored);
      std::vector<char> tmp(static_cast<size_t>(c) * elem);
      rd.read(stored, dtype, {c}, tmp.data(), tmp.size());
      std::memcpy(dst + static_cast<size_t>(r.lo - lo) * elem, tmp.data() + static_cast<size_t>(r.lo - b) * elem,
                  static_cast<size_t>(r.size()) * elem);
    }
  }
  bool has(const std::string& name) {
    for (const auto& p : pieces) {
      if (p.count > 0) return reader(p.shard).has(name);
    }
    return true;  // nothing to read from
  }
};

struct PartReader::Reshard {
  PartTarget target;
  ms::ParamLayout new_layout;              // the new part's
  int old_tp = 1, old_pp = 1, old_ep = 1;
  std::vector<ms::ModelPart> old_parts;    // [(stage * old_tp + tp_rank) * old_ep + ep_rank]
  std::vector<ms::ParamLayout> old_layouts;
  std::vector<ShardSet> old_sets;
  std::string cached_name;
  std::map<int, std::vector<char>> cache;  // old part index -> its values of cached_name

  const std::vector<char>& old_values(const std::string& name, const std::string& dtype, size_t elem, int idx) {
    if (name != cached_name) {
      cache.clear();
      cached_name = name;
    }
    auto it = cache.find(idx);
    if (it != cache.end()) return it->second;
    const int64_t n = old_layouts[static_cast<size_t>(idx)].total;
    std::vector<char> v(static_cast<size_t>(n) * elem);
    old_sets[static_cast<size_t>(idx)].read(name, dtype, elem, 0, n, v.data());
    return cache.emplace(idx, std::move(v)).first->second;
  }
  int old_stage_of(const ms::TensorSlice& ts) const {
    if (ts.layer < 0) {
      const bool head = ts.id == ms::ParamId::kLnfw || ts.id == ms::ParamId::kLnfb || ts.id == ms::ParamId::kLmHead;
      return head ? old_pp - 1 : 0;
    }
    for (int st = 0; st < old_pp; ++st) {
      const auto& op = old_parts[static_cast<size_t>(st * old_tp * old_ep)];
      if (ts.layer >= op.layer_begin && ts.layer < op.layer_end) return st;
    }
    throw Error(ErrorKind::kInternal, fmt::format("resharding: layer {} is in no old pipeline stage", ts.layer));
  }
  // The whole tensor t (of slice ts) from the old parts that hold it, `elem` bytes an element.
  void rebuild(const std::string& name, const std::string& dtype, size_t elem, const ms::ParamTensor& t,
               const ms::TensorSlice& ts, std::vector<char>& full) {
    full.assign(static_cast<size_t>(t.numel()) * elem, 0);
    const int st = old_stage_of(ts);
    const int ranks = t.split == ms::TpSplit::kReplicated ? 1 : old_tp;
    const int eps = t.experts > 0 ? old_ep : 1;  // the experts from every old ep rank, the rest from one
    for (int otp = 0; otp < ranks; ++otp) {
      for (int oep = 0; oep < eps; ++oep) {
        const int idx = (st * old_tp + otp) * old_ep + oep;
        const ms::TensorSlice* os = old_layouts[static_cast<size_t>(idx)].find_tensor(ts.id, ts.layer);
        DS_CHECK(os != nullptr, "resharding: an old part lacks a tensor it should hold");
        const char* v = old_values(name, dtype, elem, idx).data() + static_cast<size_t>(os->offset) * elem;
        for (int64_t j = 0; j < os->numel; ++j) {
          std::memcpy(full.data() + static_cast<size_t>(ms::full_index(t, old_tp, otp, j, old_ep, oep)) * elem,
                      v + static_cast<size_t>(j) * elem, elem);
        }
      }
    }
  }
  void read(const std::string& name, const std::string& dtype, size_t elem, int64_t lo, int64_t hi, char* dst) {
    const auto all = ms::model_params(target.shape);
    const auto& part = target.part;
    std::vector<char> full;
    for (const auto& ts : new_layout.tensors) {
      const auto r = layout::intersect(lo, hi, ts.offset, ts.offset + ts.numel);
      if (r.size() <= 0) continue;
      const ms::ParamTensor& t = ms::find_param(all, ts.id);
      rebuild(name, dtype, elem, t, ts, full);
      for (int64_t i = r.lo; i < r.hi; ++i) {
        const auto from =
            static_cast<size_t>(ms::full_index(t, part.tp, part.tp_rank, i - ts.offset, part.ep, part.ep_rank));
        std::memcpy(dst + static_cast<size_t>(i - lo) * elem, full.data() + from * elem, elem);
      }
    }
  }
};

namespace {

// The layout a checkpoint's shards cover: the part's, or a LoRA run's adapters alone (its frozen
// base is not in checkpoints: model_spec/lora_spec.h).
ms::ParamLayout trained_layout(const ms::ModelShape& shape, const ms::ModelPart& part) {
  const ms::ParamLayout l = ms::param_layout(shape, part);
  return shape.lora.on() ? ms::adapter_region(l) : l;
}

// The shards of the old (stage, tp rank, ep rank) part, checked to cover it: the dense region's
// ranges from every rank of its (stage, tp rank), the expert region's from those of its ep rank.
PartReader::ShardSet shard_set(const std::string& dir, const std::string& where, const ShardLayout& old,
                               int stage, int otp, int oep, const ms::ParamLayout& part_layout) {
  // The dp x cp ranks folded into one axis: a rank's coordinate there is its place in the
  // gradient group, whose consecutive runs of ep ranks are the ep groups.
  const layout::Topology topo(old.world_size, old.tensor_parallel_size,
                              old.world_size / (old.tensor_parallel_size * old.pipeline_stages), old.pipeline_stages);
  const int64_t part_numel = part_layout.total, dense = part_layout.expert_begin;
  PartReader::ShardSet set;
  set.dir = dir;
  set.where = where;
  int64_t covered = 0, covered_experts = 0;
  for (int q = 0; q < old.world_size; ++q) {
    const auto c = topo.coord_of(q);
    if (c.pp != stage || c.tp != otp) continue;
    const auto Q = static_cast<size_t>(q);
    if (!old.part_num_params.empty() && old.part_num_params[Q] != part_numel) {
      throw invalid_argument("{}: shard {} holds a part of {} parameters but the layout gives that part {}", where,
                             shard_file_name(q), old.part_num_params[Q], part_numel);
    }
    set.pieces.push_back({q, old.partitions[Q].first, old.partitions[Q].second});
    covered += old.partitions[Q].second;
    if (!old.expert_partitions.empty() && c.dp % old.expert_parallel_size == oep) {
      set.pieces.push_back({q, dense + old.expert_partitions[Q].first, old.expert_partitions[Q].second, true});
      covered_experts += old.expert_partitions[Q].second;
    }
  }
  if (covered != dense || covered_experts != part_numel - dense) {
    throw invalid_argument("{}: layout.partitions cover {} of the {} dense and {} of the {} expert parameters of stage "
                           "{}, tp rank {}, ep rank {}",
                           where, covered, dense, covered_experts, part_numel - dense, stage, otp, oep);
  }
  return set;
}

}  // namespace

PartReader::PartReader(std::string dir, const ShardLayout& old, const PartTarget& target)
    : dir_(std::move(dir)), where_(dir_ + "/manifest.json") {
  const int old_tp = old.tensor_parallel_size, old_pp = old.pipeline_stages, old_ep = old.expert_parallel_size;
  const bool same_layout = old_tp == target.part.tp && old_pp == target.pp && old_ep == target.part.ep &&
                           (target.pp == 1 || old.pipeline_partition == target.partition);
  if (same_layout) {
    same_ = std::make_unique<ShardSet>(shard_set(dir_, where_, old, target.stage, target.part.tp_rank,
                                                 target.part.ep_rank, trained_layout(target.shape, target.part)));
    return;
  }
  reshard_ = std::make_unique<Reshard>();
  reshard_->target = target;
  reshard_->new_layout = trained_layout(target.shape, target.part);
  reshard_->old_tp = old_tp;
  reshard_->old_pp = old_pp;
  reshard_->old_ep = old_ep;
  const auto split = layout::parse_stage_split_or_throw(old.pipeline_partition, where_ + ": layout.pipeline_partition");
  for (int st = 0; st < old_pp; ++st) {
    for (int otp = 0; otp < old_tp; ++otp) {
      for (int oep = 0; oep < old_ep; ++oep) {
        auto op = layout::partition_stages(target.shape, old_pp, split, old_tp, otp)[static_cast<size_t>(st)];
        op.ep = old_ep;
        op.ep_rank = oep;
        reshard_->old_parts.push_back(op);
        reshard_->old_layouts.push_back(trained_layout(target.shape, op));
        reshard_->old_sets.push_back(shard_set(dir_, where_, old, st, otp, oep, reshard_->old_layouts.back()));
      }
    }
  }
}

PartReader::~PartReader() = default;

bool PartReader::has(const std::string& name) {
  return same_ ? same_->has(name) : reshard_->old_sets.front().has(name);
}

void PartReader::read(const std::string& name, DType dtype, int64_t lo, int64_t hi, void* dst) {
  const std::string type = shard_dtype_name(dtype);
  const size_t elem = dtype_size(dtype);
  auto* out = static_cast<char*>(dst);
  if (same_) {
    same_->read(name, type, elem, lo, hi, out);
  } else {
    reshard_->read(name, type, elem, lo, hi, out);
  }
}

std::string PartReader::dtype_of(const std::string& name) {
  ShardSet& set = same_ ? *same_ : reshard_->old_sets.front();
  for (const auto& p : set.pieces) {
    if (p.count > 0) return set.reader(p.shard).dtype_of(name);
  }
  return "";
}

const char* shard_dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
  }
  return "?";
}

}  // namespace ds::rt::ckpt
