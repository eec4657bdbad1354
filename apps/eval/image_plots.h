// Pictures of an image classifier: the confusion matrix as a text table and an SVG heat map,
// and a grayscale image with a grid of attention weights laid over it (the ViT's [CLS] token
// over its patches).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tapestry::apps {

// counts[true][predicted].
using ConfusionMatrix = std::vector<std::vector<int64_t>>;

// Rows: true class, columns: predicted, then each class's recall; names label the rows.
std::string confusion_table(const ConfusionMatrix& counts, const std::vector<std::string>& names);
// The same as an SVG heat map (each cell shaded by its share of its row, the count written in it).
void write_confusion_svg(const std::string& path, const std::string& title, const ConfusionMatrix& counts,
                         const std::vector<std::string>& names);

// image: H * W values in [0, 1] (row-major); attention: grid * grid weights (row-major patches
// of patch x patch pixels, `stride` apart), drawn as translucent red squares scaled to the
// largest weight, over the image (overlapping patches add up).
void write_attention_overlay_svg(const std::string& path, const std::string& title, const std::vector<float>& image,
                                 int64_t height, int64_t width, const std::vector<float>& attention, int64_t grid,
                                 int64_t patch, int64_t stride);

}  // namespace tapestry::apps
