// SVG training curves (see plot.h).
#include "apps/eval/plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "tapestry/ops/file.h"

namespace tapestry::apps {

namespace {
struct Range {
  double lo = 0, hi = 1;
};
Range range_of(const std::vector<Series>& all, bool right) {
  Range r{INFINITY, -INFINITY};
  for (auto& s : all)
    if (s.right_axis == right)
      for (double v : s.y) r.lo = std::min(r.lo, v), r.hi = std::max(r.hi, v);
  if (!(r.lo < r.hi)) r = {std::isfinite(r.lo) ? r.lo - 1 : 0, std::isfinite(r.hi) ? r.hi + 1 : 1};
  r.lo = std::min(r.lo, 0.0);
  return r;
}
std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) out += c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '&' ? "&amp;" : std::string(1, c);
  return out;
}
}  // namespace

void write_svg_chart(const std::string& path, const std::string& title, const std::vector<Series>& series) {
  const double W = 720, H = 420, L = 70, R = 70, T = 50, B = 50;  // canvas and margins
  size_t n = 0;
  for (auto& s : series) n = std::max(n, s.y.size());
  const double xmax = std::max<double>(2, static_cast<double>(n));
  Range left = range_of(series, false), right = range_of(series, true);
  auto px = [&](double x) { return L + (x - 1) / (xmax - 1) * (W - L - R); };
  auto py = [&](double y, const Range& r) { return H - B - (y - r.lo) / (r.hi - r.lo) * (H - T - B); };
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{}\" y=\"28\" font-size=\"16\" text-anchor=\"middle\">{}</text>\n",
      W, H, W / 2, escape(title));
  // axes, ticks and grid
  svg += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n", L, H - B, W - R, H - B);
  svg += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n", L, T, L, H - B);
  svg += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n", W - R, T, W - R, H - B);
  for (int k = 0; k <= 5; ++k) {
    double fy = T + k * (H - T - B) / 5;
    double lv = left.hi - k * (left.hi - left.lo) / 5, rv = right.hi - k * (right.hi - right.lo) / 5;
    if (std::fabs(lv) < 1e-9) lv = 0;  // rounding leaves -1e-16 at the bottom: no "-0.00" label
    if (std::fabs(rv) < 1e-9) rv = 0;
    svg += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>\n", L, fy, W - R, fy);
    svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{:.2f}</text>\n", L - 6, fy + 4, lv);
    svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\">{:.1f}</text>\n", W - R + 6, fy + 4, rv);
  }
  for (size_t e = 1; e <= n; ++e)
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", px(static_cast<double>(e)),
                       H - B + 18, e);
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">epoch</text>\n", W / 2, H - 12);
  svg += fmt::format("<text x=\"16\" y=\"{}\" transform=\"rotate(-90 16 {})\" text-anchor=\"middle\">loss</text>\n",
                     H / 2, H / 2);
  svg += fmt::format("<text x=\"{}\" y=\"{}\" transform=\"rotate(90 {} {})\" text-anchor=\"middle\">BLEU</text>\n",
                     W - 16, H / 2, W - 16, H / 2);
  // series and legend
  for (size_t i = 0; i < series.size(); ++i) {
    const Series& s = series[i];
    const Range& r = s.right_axis ? right : left;
    std::string pts;
    for (size_t e = 0; e < s.y.size(); ++e)
      pts += fmt::format("{:.1f},{:.1f} ", px(static_cast<double>(e + 1)), py(s.y[e], r));
    svg += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>\n", s.color, pts);
    for (size_t e = 0; e < s.y.size(); ++e)
      svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n", px(static_cast<double>(e + 1)),
                         py(s.y[e], r), s.color);
    double ly = T + 16 + 18 * static_cast<double>(i);
    svg += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"2\"/>\n", L + 12, ly,
                       L + 36, ly, s.color);
    svg += fmt::format("<text x=\"{}\" y=\"{}\">{}{}</text>\n", L + 42, ly + 4, escape(s.name),
                       s.right_axis ? " (right axis)" : "");
  }
  svg += "</svg>\n";
  write_file_atomic(path, svg);
}

}  // namespace tapestry::apps
