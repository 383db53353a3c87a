// Slurm allocations, srun steps and the hostlist syntax (see slurm.h); expansion is below.
// Slurm's hostlist syntax, expanded: a list is comma-separated names; a name is literal text
// with bracket groups "[a-b,c,...]" that each stand for one of their numbers; several groups in
// one name multiply out in order (as Slurm's hostlist.c does). A range's numbers are printed with
// the width of its lower bound ("01-10" -> 01 ... 10).
#include "launch/slurm.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/error.h"
#include "common/strings.h"

namespace ds::launch {

namespace {

constexpr size_t kMaxExpandedHosts = 1u << 20;

[[noreturn]] void bad_nodelist(const std::string& list, size_t pos, const std::string& what) {
  throw Error(
      ErrorKind::kInvalidArgument,
      fmt::format("cannot parse the Slurm nodelist '{}' at character {}: {}", list, pos + 1, what),
      "it should look like SLURM_JOB_NODELIST does, e.g. n[01-04,07],login1 (compare "
      "`scontrol show hostnames`)");
}

// The numbers of one bracket group's text ("01-03,7"), as strings with their padding.
std::vector<std::string> expand_group(const std::string& list, size_t at, std::string_view group) {
  std::vector<std::string> out;
  for (const auto& item : split(group, ',')) {
    auto dash = item.find('-');
    std::string lo_s = item.substr(0, dash);
    std::string hi_s = dash == std::string::npos ? lo_s : item.substr(dash + 1);
    auto digits = [](const std::string& s) {
      return !s.empty() && s.size() <= 18 && s.find_first_not_of("0123456789") == std::string::npos;
    };
    if (!digits(lo_s) || !digits(hi_s))
      bad_nodelist(list, at, fmt::format("'{}' is not a number or a range a-b", item));
    int64_t lo = *parse_int(lo_s), hi = *parse_int(hi_s);
    if (hi < lo) bad_nodelist(list, at, fmt::format("range '{}' runs backwards", item));
    if (static_cast<size_t>(hi - lo) >= kMaxExpandedHosts)
      bad_nodelist(list, at, "range too large");
    for (int64_t n = lo; n <= hi; ++n) out.push_back(fmt::format("{:0{}d}", n, lo_s.size()));
  }
  return out;
}

// One name of the list ("a[1-2]b[3,5]") starting at `at` in `list`.
void expand_name(const std::string& list, size_t at, std::string_view name,
                 std::vector<std::string>& out) {
  std::vector<std::string> partial = {""};
  size_t i = 0;
  while (i < name.size()) {
    if (name[i] == ']') bad_nodelist(list, at + i, "']' without '['");
    if (name[i] != '[') {
      size_t j = name.find_first_of("[]", i);
      if (j == std::string_view::npos) j = name.size();
      for (auto& p : partial) p += name.substr(i, j - i);
      i = j;
      continue;
    }
    size_t close = name.find(']', i);
    if (close == std::string_view::npos) bad_nodelist(list, at + i, "'[' is never closed");
    std::string_view group = name.substr(i + 1, close - i - 1);
    if (group.empty()) bad_nodelist(list, at + i, "empty brackets");
    if (group.find('[') != std::string_view::npos) bad_nodelist(list, at + i, "nested '['");
    auto numbers = expand_group(list, at + i, group);
    if (partial.size() * numbers.size() > kMaxExpandedHosts)
      bad_nodelist(list, at + i, "too many hosts");
    std::vector<std::string> next;
    for (const auto& p : partial) {
      for (const auto& n : numbers) next.push_back(p + n);
    }
    partial.swap(next);
    i = close + 1;
  }
  for (auto& p : partial) out.push_back(std::move(p));
}

int positive_env(const EnvGetter& env, const char* name) {
  auto v = env(name);
  if (!v) return 0;
  // SLURM_NTASKS_PER_NODE may read "2" or, for uneven layouts, "2(x3),1": take the first count.
  auto n = parse_int(trim(v->substr(0, v->find_first_of("(,"))));
  if (!n || *n < 0) throw invalid_argument("environment variable {}='{}' is not a count", name, *v);
  return static_cast<int>(*n);
}

}  // namespace

std::vector<std::string> expand_nodelist(const std::string& list) {
  std::vector<std::string> out;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    char c = i < list.size() ? list[i] : ',';
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0) bad_nodelist(list, i, "']' without '['");
    if (c == ' ' || c == '\t') bad_nodelist(list, i, "whitespace inside the list");
    if (c != ',' || depth > 0) continue;
    if (i == start) bad_nodelist(list, i, "an empty name");
    expand_name(list, start, std::string_view(list).substr(start, i - start), out);
    start = i + 1;
  }
  if (depth > 0) bad_nodelist(list, list.size() - 1, "'[' is never closed");
  return out;
}

bool in_slurm_allocation(const EnvGetter& env) {
  return env("SLURM_JOB_ID").has_value() && env("SLURM_JOB_NODELIST").has_value();
}

SlurmAllocation read_slurm_allocation(const EnvGetter& env) {
  if (!in_slurm_allocation(env)) {
    throw Error(
        ErrorKind::kInvalidUsage,
        "--launcher slurm runs inside a Slurm allocation, but SLURM_JOB_ID/SLURM_JOB_NODELIST "
        "are not set here",
        "run it from an sbatch script or an salloc shell (e.g. salloc -N 2 dstrain launch "
        "--launcher slurm ...), or use --hostfile with --launcher ssh");
  }
  SlurmAllocation a;
  a.job_id = *env("SLURM_JOB_ID");
  a.nodes = expand_nodelist(std::string(trim(*env("SLURM_JOB_NODELIST"))));
  a.gpus_on_node = positive_env(env, "SLURM_GPUS_ON_NODE");
  a.ntasks_per_node = positive_env(env, "SLURM_NTASKS_PER_NODE");
  return a;
}

config::Hostfile slurm_hostfile(const SlurmAllocation& alloc, int nproc_per_node, int local_gpus) {
  int slots = nproc_per_node > 0          ? nproc_per_node
              : alloc.gpus_on_node > 0    ? alloc.gpus_on_node
              : alloc.ntasks_per_node > 0 ? alloc.ntasks_per_node
                                          : local_gpus;
  if (slots <= 0) {
    throw Error(
        ErrorKind::kInvalidArgument,
        fmt::format("Slurm job {}: no slot count per node (no --nproc-per-node, no "
                    "SLURM_GPUS_ON_NODE, no SLURM_NTASKS_PER_NODE, no GPU on this node)",
                    alloc.job_id),
        "pass --nproc-per-node N, or allocate with --ntasks-per-node=N or --gpus-per-node=N");
  }
  config::Hostfile out;
  out.path = fmt::format("<Slurm job {}>", alloc.job_id);
  for (const auto& host : alloc.nodes) out.hosts.push_back({host, slots, 0});
  return out;
}

std::vector<std::string> srun_command(const std::string& srun,
                                      const std::vector<std::string>& hosts,
                                      const std::string& job_name,
                                      const std::vector<std::string>& extra_args) {
  const std::string n = std::to_string(hosts.size());
  std::vector<std::string> cmd = {srun, "--nodes=" + n, "--ntasks=" + n, "--ntasks-per-node=1",
                                  fmt::format("--nodelist={}", fmt::join(hosts, ",")),
                                  // Every CPU and GPU of the node for the agent's workers, not
                                  // the one CPU a one-task step would get.
                                  "--whole", "--mpi=none", "--kill-on-bad-exit=0",
                                  "--job-name=" + job_name};
  cmd.insert(cmd.end(), extra_args.begin(), extra_args.end());
  return cmd;
}

}  // namespace ds::launch
