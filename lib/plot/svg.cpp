// The SVG writer of svg.h. Numbers are written with two decimals and their trailing zeros
// trimmed: enough for sub-pixel placement, short enough that a long run's polyline stays small.
#include "plot/svg.h"

#include <cmath>

#include <fmt/format.h>

namespace ds::plot {

namespace {

std::string num(double v) {
  if (!std::isfinite(v)) v = 0;
  std::string s = fmt::format("{:.2f}", v);
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  if (s == "-0") s = "0";
  return s;
}

std::string stroke_attrs(const Stroke& s) {
  std::string a =
      fmt::format(R"( stroke="{}" stroke-width="{}")", xml_escape(s.colour), num(s.width));
  if (!s.dash.empty()) a += fmt::format(R"( stroke-dasharray="{}")", xml_escape(s.dash));
  return a;
}

const char* anchor_name(Anchor a) {
  switch (a) {
    case Anchor::kMiddle:
      return "middle";
    case Anchor::kEnd:
      return "end";
    case Anchor::kStart:
      break;
  }
  return "start";
}

}  // namespace

std::string xml_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n') {
          out += ' ';
        } else {
          out += c;
        }
    }
  }
  return out;
}

SvgWriter::SvgWriter(double width, double height) : width_(width), height_(height) {}

void SvgWriter::rect(double x, double y, double w, double h, const std::string& fill,
                     const Stroke* stroke) {
  body_ +=
      fmt::format(R"(<rect x="{}" y="{}" width="{}" height="{}" fill="{}"{}/>)", num(x), num(y),
                  num(w), num(h), xml_escape(fill), stroke ? stroke_attrs(*stroke) : "");
  body_ += '\n';
}

void SvgWriter::line(Point a, Point b, const Stroke& stroke) {
  body_ += fmt::format(R"(<line x1="{}" y1="{}" x2="{}" y2="{}"{}/>)", num(a.x), num(a.y), num(b.x),
                       num(b.y), stroke_attrs(stroke));
  body_ += '\n';
}

void SvgWriter::polyline(const std::vector<Point>& points, const Stroke& stroke) {
  if (points.empty()) return;
  std::string pts;
  pts.reserve(points.size() * 14);
  for (const auto& p : points) {
    if (!pts.empty()) pts += ' ';
    pts += num(p.x);
    pts += ',';
    pts += num(p.y);
  }
  body_ += fmt::format(R"(<polyline points="{}" fill="none"{} stroke-linejoin="round"/>)", pts,
                       stroke_attrs(stroke));
  body_ += '\n';
}

void SvgWriter::circle(Point c, double r, const std::string& fill) {
  body_ += fmt::format(R"(<circle cx="{}" cy="{}" r="{}" fill="{}"/>)", num(c.x), num(c.y), num(r),
                       xml_escape(fill));
  body_ += '\n';
}

void SvgWriter::text(Point at, std::string_view s, const TextStyle& style) {
  std::string attrs =
      fmt::format(R"( x="{}" y="{}" font-size="{}" text-anchor="{}" fill="{}")", num(at.x),
                  num(at.y), num(style.size), anchor_name(style.anchor), xml_escape(style.colour));
  if (style.bold) attrs += R"( font-weight="bold")";
  if (style.rotate != 0) {
    attrs +=
        fmt::format(" transform=\"rotate({} {} {})\"", num(style.rotate), num(at.x), num(at.y));
  }
  body_ += fmt::format("<text{}>{}</text>\n", attrs, xml_escape(s));
}

std::string SvgWriter::finish() const {
  return fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n"
      "{2}</svg>\n",
      num(width_), num(height_), body_);
}

}  // namespace ds::plot
