// The pictures of image_plots.h, written as plain SVG through write_file_atomic.
#include "apps/eval/image_plots.h"

#include <fmt/format.h>

#include <algorithm>

#include "tapestry/ops/error.h"
#include "tapestry/ops/file.h"

namespace tapestry::apps {

namespace {
std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) out += c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '&' ? "&amp;" : std::string(1, c);
  return out;
}
int64_t row_total(const std::vector<int64_t>& row) {
  int64_t t = 0;
  for (int64_t v : row) t += v;
  return t;
}
}  // namespace

std::string confusion_table(const ConfusionMatrix& counts, const std::vector<std::string>& names) {
  const size_t k = counts.size();
  TP_CHECK(names.size() == k, "confusion_table: {} names for {} classes", names.size(), k);
  size_t label_width = 10;
  for (const std::string& n : names) label_width = std::max(label_width, n.size());
  std::string s = fmt::format("{:<{}}", "true \\ predicted", label_width + 2);
  for (size_t j = 0; j < k; ++j) s += fmt::format("{:>6}", j);
  s += "  recall\n";
  for (size_t i = 0; i < k; ++i) {
    s += fmt::format("{:<{}}", fmt::format("{} {}", i, names[i]), label_width + 2);
    for (size_t j = 0; j < k; ++j) s += fmt::format("{:>6}", counts[i][j]);
    const int64_t total = row_total(counts[i]);
    s += total ? fmt::format("  {:6.2f}%\n", 100.0 * static_cast<double>(counts[i][i]) / static_cast<double>(total))
               : "       -\n";
  }
  return s;
}

void write_confusion_svg(const std::string& path, const std::string& title, const ConfusionMatrix& counts,
                         const std::vector<std::string>& names) {
  const int64_t k = static_cast<int64_t>(counts.size());
  const double cell = 44, left = 130, top = 60, W = left + cell * static_cast<double>(k) + 20,
               H = top + cell * static_cast<double>(k) + 50;
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" font-family=\"sans-serif\" "
      "font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{:.0f}\" y=\"22\" font-size=\"14\" text-anchor=\"middle\">{}</text>\n"
      "<text x=\"{:.0f}\" y=\"44\" text-anchor=\"middle\">predicted</text>\n",
      W, H, W / 2, escape(title), left + cell * static_cast<double>(k) / 2);
  for (int64_t i = 0; i < k; ++i) {
    const double total = static_cast<double>(std::max<int64_t>(1, row_total(counts[static_cast<size_t>(i)])));
    const double y = top + cell * static_cast<double>(i);
    s += fmt::format("<text x=\"{:.0f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", left - 6, y + cell / 2 + 4,
                     escape(names[static_cast<size_t>(i)]));
    for (int64_t j = 0; j < k; ++j) {
      const int64_t v = counts[static_cast<size_t>(i)][static_cast<size_t>(j)];
      const double share = static_cast<double>(v) / total, x = left + cell * static_cast<double>(j);
      // Diagonal cells in blue, mistakes in red, both shaded by their share of the row.
      const char* color = i == j ? "31,119,180" : "214,39,40";
      s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"rgb({})\" "
                       "fill-opacity=\"{:.3f}\" stroke=\"#ddd\"/>\n",
                       x, y, cell, cell, color, i == j ? share : std::min(1.0, 4 * share));
      if (v > 0)
        s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", x + cell / 2,
                         y + cell / 2 + 4, v);
    }
  }
  for (int64_t j = 0; j < k; ++j)
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n",
                     left + cell * (static_cast<double>(j) + 0.5), top + cell * static_cast<double>(k) + 16, j);
  s += fmt::format("<text x=\"{:.0f}\" y=\"{:.0f}\" text-anchor=\"middle\">rows: true class (numbered as the "
                   "columns); blue: correct, red: confused</text>\n</svg>\n",
                   W / 2, H - 10);
  write_file_atomic(path, s);
}

void write_attention_overlay_svg(const std::string& path, const std::string& title, const std::vector<float>& image,
                                 int64_t height, int64_t width, const std::vector<float>& attention, int64_t grid,
                                 int64_t patch, int64_t stride) {
  TP_CHECK(static_cast<int64_t>(image.size()) == height * width, "attention overlay: {} pixels for a {}x{} image",
           image.size(), height, width);
  TP_CHECK(static_cast<int64_t>(attention.size()) == grid * grid, "attention overlay: {} weights for a {}x{} grid",
           attention.size(), grid, grid);
  const double px = 12, top = 40, side = 10, W = px * static_cast<double>(width) * 2 + 3 * side,
               H = top + px * static_cast<double>(height) + 30;
  const float peak = std::max(1e-12f, *std::max_element(attention.begin(), attention.end()));
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{:.0f}\" y=\"22\" text-anchor=\"middle\">{}</text>\n",
      W, H, W / 2, escape(title));
  // Left: the image; right: the image with the weights over it.
  for (int panel = 0; panel < 2; ++panel) {
    const double x0 = side + static_cast<double>(panel) * (px * static_cast<double>(width) + side);
    for (int64_t y = 0; y < height; ++y)
      for (int64_t x = 0; x < width; ++x) {
        const int g = static_cast<int>(255 * std::clamp(image[static_cast<size_t>(y * width + x)], 0.0f, 1.0f));
        s += fmt::format("<rect x=\"{:.0f}\" y=\"{:.0f}\" width=\"{:.0f}\" height=\"{:.0f}\" fill=\"rgb({},{},{})\"/>\n",
                         x0 + px * static_cast<double>(x), top + px * static_cast<double>(y), px, px, g, g, g);
      }
    if (panel == 0) continue;
    const double side_px = px * static_cast<double>(patch), step = px * static_cast<double>(stride);
    // Overlapping patches: each square's opacity shrinks so that the overlaps add up to the same scale.
    const double overlap = static_cast<double>(patch) / static_cast<double>(stride);
    for (int64_t r = 0; r < grid; ++r)
      for (int64_t c = 0; c < grid; ++c)
        s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"red\" "
                         "fill-opacity=\"{:.3f}\"/>\n",
                         x0 + step * static_cast<double>(c), top + step * static_cast<double>(r), side_px, side_px,
                         0.75 * attention[static_cast<size_t>(r * grid + c)] / peak / (overlap * overlap));
  }
  s += fmt::format("<text x=\"{:.0f}\" y=\"{:.0f}\" text-anchor=\"middle\">left: the image; right: the [CLS] token's "
                   "attention over the patches (red: more)</text>\n</svg>\n",
                   W / 2, H - 8);
  write_file_atomic(path, s);
}

}  // namespace tapestry::apps
