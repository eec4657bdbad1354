// Attention heat maps of a trained translator (`tapestry attention`): every head of the chosen
// layers of encoder self-attention, decoder self-attention and decoder-source attention, for one
// sentence and its translation, as one self-contained HTML page of SVG grids labelled with the
// subword pieces.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "apps/data/subword.h"
#include "tapestry/models/transformer.h"

namespace tapestry::apps {

struct AttentionMap {
  std::string kind;  // "encoder self-attention", "decoder self-attention", "decoder-source attention"
  int64_t layer = 0;
  Tensor weights;    // [heads, rows, cols] float32: row i's attention over the columns
  std::vector<std::string> rows, cols;  // the pieces labelling them
};

struct AttentionMaps {
  std::string source, translation;
  std::vector<AttentionMap> maps;
};

// Runs the model once, teacher-forced on `target` (empty: its own beam-4 translation of the
// sentence), keeping the attention weights. `layers` picks layers by index (empty: all); a layer
// the model does not have throws a tapestry::Error naming it.
AttentionMaps attention_maps(models::Transformer& model, const Subword& subword, const std::string& sentence,
                             const std::string& target = "", const std::vector<int64_t>& layers = {});

// The maps as one HTML page (inline SVG, no scripts or downloads), written atomically.
void write_attention_html(const std::string& path, const AttentionMaps& maps);

}  // namespace tapestry::apps
