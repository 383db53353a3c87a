// The SVG writer: escaping, number formatting, one element per call.
#include <gtest/gtest.h>

#include "plot/svg.h"

namespace ds::plot {
namespace {

TEST(PlotSvg, EscapesMarkupAndControlBytes) {
  EXPECT_EQ(xml_escape("a<b & \"c\" 'd'>"), "a&lt;b &amp; &quot;c&quot; &apos;d&apos;&gt;");
  EXPECT_EQ(xml_escape(std::string("x\x01y", 3)), "x y");
}

TEST(PlotSvg, WritesElementsWithShortNumbers) {
  SvgWriter w(100, 50);
  w.polyline({{1, 2.5}, {3.333, 4}}, {"#ff0000", 1.5, "6 4"});
  w.polyline({}, {});
  w.text({10, 20}, "loss & more", {12, Anchor::kMiddle, -90, true, "#000000"});
  const std::string doc = w.finish();
  EXPECT_NE(
      doc.find(
          R"(<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="100" height="50" viewBox="0 0 100 50")"),
      std::string::npos)
      << doc;
  EXPECT_NE(doc.find(R"(points="1,2.5 3.33,4")"), std::string::npos) << doc;
  EXPECT_NE(doc.find(R"(stroke-dasharray="6 4")"), std::string::npos) << doc;
  EXPECT_NE(doc.find(R"x(transform="rotate(-90 10 20)")x"), std::string::npos) << doc;
  EXPECT_NE(doc.find(">loss &amp; more</text>"), std::string::npos) << doc;
  size_t n = 0;
  for (size_t at = doc.find("<polyline"); at != std::string::npos;
       at = doc.find("<polyline", at + 1))
    ++n;
  EXPECT_EQ(n, 1u);  // an empty point list writes nothing
}

}  // namespace
}  // namespace ds::plot
