// Hostfile parsing and DeepSpeed's resource filters: the exact error for each malformed input,
// and the filter semantics as a table.
#include "config/hostfile.h"

#include <filesystem>

#include <gtest/gtest.h>

#include "common/error.h"

namespace ds::config {
namespace {

std::string error_of(const std::string& text) {
  try {
    parse_hostfile(text, "hf");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    return e.what();
  }
  return "<no error>";
}

TEST(Hostfile, ParsesHostsCommentsAndBlankLines) {
  auto hf = parse_hostfile(
      "# cluster\n\nworker-0 slots=4\n   worker-1   slots=2   # trailing\n\t\nworker-2 slots=1", "hf");
  ASSERT_EQ(hf.hosts.size(), 3u);
  EXPECT_EQ(hf.hosts[0].host, "worker-0");
  EXPECT_EQ(hf.hosts[0].slots, 4);
  EXPECT_EQ(hf.hosts[0].line, 3);
  EXPECT_EQ(hf.hosts[1].host, "worker-1");
  EXPECT_EQ(hf.hosts[1].slots, 2);
  EXPECT_EQ(hf.hosts[2].line, 6);
}

struct BadCase {
  const char* text;
  const char* error;
};

TEST(Hostfile, MalformedInputsGetExactErrors) {
  const BadCase cases[] = {
      {"worker-0\n", "hf:1: host 'worker-0' has no slot count (expected 'worker-0 slots=N')"},
      {"a slots=1\nworker-0 slots=\n",
       "hf:2: missing slot count in 'slots=' (expected 'slots=N' with N >= 1)"},
      {"worker-0 slots=0\n", "hf:1: slot count must be at least 1, got 0"},
      {"worker-0 slots=-2\n", "hf:1: slot count must be at least 1, got -2"},
      {"worker-0 slots=four\n",
       "hf:1: slot count 'four' is not an integer (expected 'slots=N' with N >= 1)"},
      {"worker-0 slots=1.5\n",
       "hf:1: slot count '1.5' is not an integer (expected 'slots=N' with N >= 1)"},
      {"worker-0 gpus=4\n", "hf:1: unknown token 'gpus=4' (expected 'slots=N' after the hostname)"},
      {"worker-0 slots=4 extra\n",
       "hf:1: unknown token 'extra' (expected exactly 'hostname slots=N')"},
      {"w0 slots=1\n# c\nw0 slots=2\n", "hf:3: duplicate host 'w0' (first listed on line 1)"},
      {"", "hf: the hostfile lists no hosts (expected lines like 'worker-0 slots=4')"},
      {"# only comments\n\n", "hf: the hostfile lists no hosts (expected lines like 'worker-0 slots=4')"},
      {"slots=4 worker-0\n", "hf:1: expected a hostname first, got 'slots=4'"},
  };
  for (const auto& c : cases) EXPECT_EQ(error_of(c.text), c.error) << "input: " << c.text;
}

TEST(Hostfile, MissingFileNamesIt) {
  try {
    load_hostfile("/nonexistent/hosts");
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "cannot read hostfile /nonexistent/hosts: No such file or directory");
  }
}

// Renders the filtered world as "host:slots host:slots" for compact table rows.
std::string render(const std::vector<NodeSlots>& nodes) {
  std::string out;
  for (const auto& n : nodes) {
    if (!out.empty()) out += ' ';
    out += n.host + ':';
    for (size_t i = 0; i < n.slots.size(); ++i) out += (i ? "," : "") + std::to_string(n.slots[i]);
  }
  return out;
}

std::string filter(const ResourceFilter& f) {
  auto hf = parse_hostfile("worker-0 slots=4\nworker-1 slots=4\nworker-2 slots=2\n", "hosts");
  try {
    return render(apply_filters(hf, f));
  } catch (const Error& e) {
    return std::string("error: ") + e.what();
  }
}

TEST(HostFilters, Table) {
  struct Row {
    ResourceFilter f;
    const char* want;
  };
  const Row rows[] = {
      {{}, "worker-0:0,1,2,3 worker-1:0,1,2,3 worker-2:0,1"},
      // DeepSpeed's documented example: a bare host keeps all its slots (DeepSpeed's code drops
      // it, its issue 6671; we follow the documentation).
      {{"worker-0@worker-1:0,2", "", -1, -1}, "worker-0:0,1,2,3 worker-1:0,2"},
      {{"worker-1:2,0", "", -1, -1}, "worker-1:0,2"},
      {{"worker-2@worker-0:3", "", -1, -1}, "worker-0:3 worker-2:0,1"},  // file order kept
      {{"", "worker-1", -1, -1}, "worker-0:0,1,2,3 worker-2:0,1"},
      {{"", "worker-0:0,1@worker-2:1", -1, -1}, "worker-0:2,3 worker-1:0,1,2,3 worker-2:0"},
      {{"", "worker-2:0,1", -1, -1}, "worker-0:0,1,2,3 worker-1:0,1,2,3"},
      {{"", "", 2, -1}, "worker-0:0,1,2,3 worker-1:0,1,2,3"},
      {{"", "", -1, 2}, "worker-0:0,1 worker-1:0,1 worker-2:0,1"},
      {{"", "", 1, 3}, "worker-0:0,1,2"},
      {{"worker-0", "worker-1", -1, -1}, "error: --include and --exclude cannot be used together"},
      {{"worker-0", "", 1, -1}, "error: --include cannot be combined with --num-nodes or --num-gpus"},
      {{"", "worker-0", -1, 2}, "error: --exclude cannot be combined with --num-nodes or --num-gpus"},
      {{"worker-9", "", -1, -1}, "error: --include: host 'worker-9' is not in the hostfile hosts"},
      {{"", "worker-9:0", -1, -1}, "error: --exclude: host 'worker-9' is not in the hostfile hosts"},
      {{"worker-2:2", "", -1, -1},
       "error: --include: host 'worker-2' has no slot 2 (the hostfile hosts gives it slots 0-1)"},
      {{"worker-0:x", "", -1, -1},
       "error: --include 'worker-0:x': slot 'x' of host 'worker-0' is not a non-negative integer"},
      {{"worker-0@@worker-1", "", -1, -1},
       "error: --include 'worker-0@@worker-1': empty host between '@' separators"},
      // Found by tests/fuzz (fuzz_hostfile): a slot past int's range once wrapped to slot -1 and was kept.
      {{"worker-0:4294967295", "", -1, -1},
       "error: --include 'worker-0:4294967295': host 'worker-0' has no slot 4294967295 (a host has at most 4096 slots)"},
      {{"", "worker-0:0,999999999990", -1, -1},
       "error: --exclude 'worker-0:0,999999999990': host 'worker-0' has no slot 999999999990 (a host has at most 4096 slots)"},
      {{"", "", -1, 3}, "error: --num-gpus 3 is more than the 2 slot(s) of host 'worker-2' in hosts"},
      {{"", "", 4, -1}, "error: --num-nodes 4 is more than the 3 host(s) in hosts"},
      {{"", "", 0, -1}, "error: --num-nodes must be at least 1, got 0"},
      {{"", "worker-0@worker-1@worker-2", -1, -1},
       "error: the filters leave no slots to run on (hostfile hosts)"},
  };
  for (const auto& r : rows) {
    EXPECT_EQ(filter(r.f), r.want) << "include='" << r.f.include << "' exclude='" << r.f.exclude
                                   << "' nodes=" << r.f.num_nodes << " gpus=" << r.f.num_gpus;
  }
}

TEST(Hostfile, EveryShippedHostfileParses) {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(DS_SOURCE_DIR "/hostfiles")) {
    SCOPED_TRACE(entry.path().string());
    auto hf = load_hostfile(entry.path().string());
    EXPECT_FALSE(hf.hosts.empty());
    EXPECT_FALSE(apply_filters(hf, {}).empty());
    ++n;
  }
  EXPECT_GE(n, 2);
}

}  // namespace
}  // namespace ds::config
