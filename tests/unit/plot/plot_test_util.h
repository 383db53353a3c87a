// Helpers for the plot tests: a scratch directory, metrics files written from records, and an
// SVG parsed back by python3's xml.etree (a real XML parser, so "valid XML" means what it says)
// into JSON: every <polyline> with its stroke and points, every <text>'s content.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/run_command.h"

namespace ds::plot::test {

class ScratchDir {
 public:
  ScratchDir() {
    char tmpl[] = "/tmp/ds_plot_test_XXXXXX";
    path_ = mkdtemp(tmpl) ? tmpl : "/tmp";
  }
  ~ScratchDir() {
    std::error_code ec;
    if (path_ != "/tmp") std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline void write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

// A run of `steps` steps: loss falling from `loss0`, val_loss every 5 steps, a warmup lr, tokens/s,
// peaks for params, total and comm (always 0), and a --metrics-all-ranks copy to be ignored.
inline std::string synthetic_run(int steps, double loss0) {
  std::string out;
  for (int s = 1; s <= steps; ++s) {
    nlohmann::ordered_json j;
    j["step"] = s;
    j["loss"] = loss0 / (1 + 0.1 * s);
    j["lr"] = 1e-3 * std::min(1.0, s / 5.0);
    j["tokens_per_s"] = 4000 + 10 * s;
    j["peak_bytes_params"] = 3 << 20;
    j["peak_bytes_total"] = (50 << 20) + s;
    j["peak_bytes_comm"] = 0;
    j["peak_bytes_total_rank1"] = 1;
    if (s % 5 == 0) j["val_loss"] = loss0 / (1 + 0.1 * s) + 0.05;
    out += j.dump() + "\n";
  }
  return out;
}

// {"polylines": [{"stroke": "#1f77b4", "points": [[x, y], ...]}, ...], "texts": ["...", ...],
//  "circles": N, "root": "svg"}; an XML error fails the test.
inline nlohmann::json parse_svg(const std::string& svg_path, const ScratchDir& dir) {
  const std::string script = dir.file("parse_svg.py");
  write(script, R"(import json, sys
import xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
ns = '{http://www.w3.org/2000/svg}'
polylines = [{'stroke': p.get('stroke'),
              'points': [[float(v) for v in xy.split(',')] for xy in p.get('points').split()]}
             for p in root.iter(ns + 'polyline')]
texts = [t.text or '' for t in root.iter(ns + 'text')]
circles = len(list(root.iter(ns + 'circle')))
print(json.dumps({'root': root.tag.replace(ns, ''), 'polylines': polylines, 'texts': texts, 'circles': circles}))
)");
  auto r = ds::test::run_command("python3 " + script + " " + svg_path);
  EXPECT_EQ(r.exit_code, 0) << "not valid XML: " << r.err;
  if (r.exit_code != 0) return nlohmann::json::object();
  return nlohmann::json::parse(r.out);
}

}  // namespace ds::plot::test
