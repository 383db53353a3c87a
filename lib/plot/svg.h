// A small SVG 1.1 writer: the handful of elements a line chart needs (rect, line, polyline,
// circle, text), appended in order to one document string. Coordinates are user units (pixels
// at 1:1), y down. Text is XML-escaped; colours and dash patterns are passed through as given
// (SVG syntax: "#1f77b4", "6 4").
//
// Deliberately not: a DOM, groups, transforms beyond rotated text, gradients, or any parsing.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ds::plot {

struct Point {
  double x = 0, y = 0;
};

struct Stroke {
  std::string colour = "#000000";
  double width = 1;
  std::string dash;    // empty: solid; else stroke-dasharray ("6 4")
};

enum class Anchor { kStart, kMiddle, kEnd };

struct TextStyle {
  double size = 12;  // font size, user units
  Anchor anchor = Anchor::kStart;
  double rotate = 0;  // degrees, about (x, y); -90 for a y-axis label
  bool bold = false;
  std::string colour = "#000000";
};

// &, <, >, " and ' as entities; bytes below 0x20 (other than tab and newline) become spaces,
// since XML 1.0 cannot hold them at all.
std::string xml_escape(std::string_view s);

class SvgWriter {
 public:
  SvgWriter(double width, double height);

  void rect(double x, double y, double w, double h, const std::string& fill,
            const Stroke* stroke = nullptr);
  void line(Point a, Point b, const Stroke& stroke);
  // One <polyline> element for all the points (none for an empty list).
  void polyline(const std::vector<Point>& points, const Stroke& stroke);
  void circle(Point c, double r, const std::string& fill);
  void text(Point at, std::string_view s, const TextStyle& style);

  // The whole document: XML declaration, <svg> with width, height and viewBox, the elements.
  std::string finish() const;

 private:
  double width_, height_;
  std::string body_;
};

}  // namespace ds::plot
