// The named shapes (model_spec/named_shapes.h): every one is a valid model of a registered family,
// names are unique, the calibration default is one of them, the GPU benchmark's 124m is llm.c's
// 124M (124,475,904 parameters), and an unknown name is refused with the list of names.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "common/error.h"
#include "model_spec/family.h"
#include "model_spec/named_shapes.h"
#include "model_spec/shape.h"

namespace ms = ds::model_spec;

TEST(NamedShapes, EveryOneIsAValidModelWithAUniqueName) {
  std::set<std::string> names;
  for (const ms::NamedShape& n : ms::named_shapes()) {
    EXPECT_TRUE(names.insert(n.name).second) << n.name;
    EXPECT_NO_THROW(n.shape.validate()) << n.name;
    EXPECT_NE(ms::find_family(ms::family_of(n.shape).name), nullptr) << n.name;
    EXPECT_GT(std::string(n.what).size(), 0u) << n.name;
  }
  EXPECT_GE(names.size(), 3u);
  EXPECT_EQ(ms::param_count(ms::named_shape("124m", "test").shape), 124475904);
  // gpu_bench's mixture of experts, as its description says: 0.93B parameters, 0.30B active.
  const ms::ModelShape moe = ms::named_shape("mixtral-0.9b", "test").shape;
  EXPECT_NEAR(static_cast<double>(ms::param_count(moe)), 0.93e9, 0.005e9);
  EXPECT_NEAR(static_cast<double>(ms::active_param_count(moe)), 0.30e9, 0.01e9);
  EXPECT_EQ(&ms::named_shape(ms::kDefaultCalibrationShape, "test"), &ms::named_shape("124m", "test"));
}

TEST(NamedShapes, AnUnknownNameIsRefusedWithTheNames) {
  try {
    ms::named_shape("7b", "gpu_bench --model");
    FAIL() << "an unknown name was accepted";
  } catch (const ds::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("gpu_bench --model"), std::string::npos) << m;
    EXPECT_NE(m.find("'7b'"), std::string::npos) << m;
    EXPECT_NE(m.find(ms::named_shape_names()), std::string::npos) << m;
  }
}
