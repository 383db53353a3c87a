// Every tensor of a safetensors file or directory (with its index) as fp32, by name: how the
// export tests compare two exports, or an export with its source.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"

namespace ds::test {

inline std::map<std::string, std::vector<float>> read_safetensors_all(const std::string& path) {
  rt::ckpt::SafetensorsSet set(path);
  std::map<std::string, std::vector<float>> out;
  for (const auto& n : set.names()) {
    std::vector<float> v(static_cast<size_t>(set.find(n)->numel()));
    set.read_f32(n, {}, v.data());
    out[n] = std::move(v);
  }
  return out;
}

}  // namespace ds::test
