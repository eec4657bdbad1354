// A small SVG line chart for training curves: one x axis (epochs), losses on the left axis,
// BLEU on the right, so a person can open the file in any browser.
#pragma once
#include <string>
#include <vector>

namespace tapestry::apps {

struct Series {
  std::string name, color;
  std::vector<double> y;  // one value per epoch (x = 1, 2, ...)
  bool right_axis = false;
};

// Writes the chart atomically (temp file + rename). Throws tapestry::Error if it cannot.
void write_svg_chart(const std::string& path, const std::string& title, const std::vector<Series>& series);

}  // namespace tapestry::apps
