// Attention heat maps (see attention_map.h).
#include "apps/eval/attention_map.h"

#include <algorithm>
#include <map>

#include "tapestry/ops/file.h"
#include "tapestry/autograd/grad_mode.h"
#include "tapestry/ops/factory.h"

namespace tapestry::apps {

using namespace models;  // the architectures and their decoding

namespace {

std::string escape_xml(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// One head as an SVG grid: row labels on the left, column labels rotated above, each cell shaded
// by its weight (white 0 to dark blue 1), the exact value in its tooltip.
std::string head_svg(const float* w, const std::vector<std::string>& rows, const std::vector<std::string>& cols,
                     const std::string& title) {
  const int cell = 16, label = 90, top = 90;
  // Room on the right for the last column labels, which lean right (about top / tan 60 degrees).
  const int width = label + cell * static_cast<int>(cols.size()) + 60;
  const int height = top + cell * static_cast<int>(rows.size()) + 4;
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"monospace\" "
      "font-size=\"11\"><title>{}</title>\n",
      width, height, escape_xml(title));
  for (size_t j = 0; j < cols.size(); ++j) {
    int x = label + cell * static_cast<int>(j) + cell / 2 + 4;
    s += fmt::format("<text transform=\"translate({},{}) rotate(-60)\">{}</text>\n", x, top - 4, escape_xml(cols[j]));
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    int y = top + cell * static_cast<int>(i);
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", label - 4, y + cell - 4,
                     escape_xml(rows[i]));
    for (size_t j = 0; j < cols.size(); ++j) {
      float v = w[i * cols.size() + j];
      int shade = static_cast<int>(255 * (1 - std::clamp(v, 0.0f, 1.0f)) + 0.5f);
      s += fmt::format(
          "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"rgb({},{},255)\"><title>{} -> {}: "
          "{:.3f}</title></rect>\n",
          label + cell * static_cast<int>(j), y, cell, cell, shade, shade, escape_xml(rows[i]), escape_xml(cols[j]), v);
    }
  }
  return s + "</svg>\n";
}

}  // namespace

AttentionMaps attention_maps(Transformer& model, const Subword& sp, const std::string& sentence,
                             const std::string& target, const std::vector<int64_t>& layers) {
  const auto& cfg = model.config;
  const int64_t max_layers = std::max(cfg.enc_layers, cfg.dec_layers);
  for (int64_t l : layers)
    TP_CHECK(l >= 0 && l < max_layers, "attention: the model has layers 0 to {}, not {}", max_layers - 1, l);
  auto wanted = [&](int64_t l) { return layers.empty() || std::count(layers.begin(), layers.end(), l) > 0; };

  AttentionMaps out;
  out.source = sentence;
  std::vector<int64_t> src_ids = sp.encode(sentence), tgt_ids;
  TP_CHECK(!src_ids.empty(), "attention: the sentence is empty");
  const int64_t S = static_cast<int64_t>(src_ids.size());
  if (target.empty()) {  // the model's own pieces (text would not always encode back to them)
    DecodeOptions opt;
    opt.bos = Subword::kBos, opt.eos = Subword::kEos;
    tgt_ids = beam_search(model, tensor(src_ids, {1, S}), 4, 0.6, opt)[0].tokens;
    if (!tgt_ids.empty() && tgt_ids.back() == Subword::kEos) tgt_ids.pop_back();
    out.translation = sp.decode(tgt_ids);
  } else {
    tgt_ids = sp.encode(target);
    out.translation = target;
  }
  std::vector<int64_t> tgt_in = {Subword::kBos};
  tgt_in.insert(tgt_in.end(), tgt_ids.begin(), tgt_ids.end());
  std::vector<std::string> src_pieces, tgt_pieces;
  for (int64_t id : src_ids) src_pieces.push_back(sp.piece(id));
  for (int64_t id : tgt_in) tgt_pieces.push_back(sp.piece(id));

  std::vector<std::shared_ptr<nn::MultiHeadAttention>> modules;
  std::vector<std::shared_ptr<EncoderLayer>> enc;
  std::vector<std::shared_ptr<DecoderLayer>> dec;
  for (size_t i = 0; i < model.encoder_layers->size(); ++i) enc.push_back(model.encoder_layers->at<EncoderLayer>(i));
  for (size_t i = 0; i < model.decoder_layers->size(); ++i) dec.push_back(model.decoder_layers->at<DecoderLayer>(i));
  for (auto& l : enc) modules.push_back(l->self_attn);
  for (auto& l : dec) modules.push_back(l->self_attn), modules.push_back(l->src_attn);
  // One teacher-forced forward, each attention module's weights caught by a hook.
  // The hooks point at `caught`: they come off however the forward ends (a throw included).
  std::map<const nn::MultiHeadAttention*, Tensor> caught;
  struct HooksOff {
    std::vector<std::shared_ptr<nn::MultiHeadAttention>>& modules;
    ~HooksOff() {
      for (auto& m : modules) m->set_attention_hook(nullptr);
    }
  } hooks_off{modules};
  for (auto& m : modules) {
    const nn::MultiHeadAttention* key = m.get();
    m->set_attention_hook([&caught, key](const Tensor& w) { caught[key] = w; });
  }
  {
    NoGradGuard no_grad;
    model.eval();
    const int64_t T = static_cast<int64_t>(tgt_in.size());
    model.forward(tensor(src_ids, {1, S}), tensor(tgt_in, {1, T}));
  }
  auto take = [&](const char* kind, int64_t layer, nn::MultiHeadAttention& m, const std::vector<std::string>& rows,
                  const std::vector<std::string>& cols) {
    out.maps.push_back(AttentionMap{kind, layer, caught.at(&m).select(0, 0).contiguous(), rows, cols});
  };
  for (size_t l = 0; l < enc.size(); ++l)
    if (wanted(static_cast<int64_t>(l))) take("encoder self-attention", static_cast<int64_t>(l), *enc[l]->self_attn, src_pieces, src_pieces);
  for (size_t l = 0; l < dec.size(); ++l)
    if (wanted(static_cast<int64_t>(l))) take("decoder self-attention", static_cast<int64_t>(l), *dec[l]->self_attn, tgt_pieces, tgt_pieces);
  for (size_t l = 0; l < dec.size(); ++l)
    if (wanted(static_cast<int64_t>(l))) take("decoder-source attention", static_cast<int64_t>(l), *dec[l]->src_attn, tgt_pieces, src_pieces);
  return out;
}

void write_attention_html(const std::string& path, const AttentionMaps& m) {
  std::string h =
      "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>tapestry attention</title>\n"
      "<style>body{font-family:sans-serif;margin:20px} .heads{display:flex;flex-wrap:wrap;gap:12px} "
      "figure{margin:0} figcaption{font-size:12px;text-align:center}</style></head><body>\n";
  h += fmt::format("<h1>Attention</h1>\n<p>source: {}<br>translation: {}</p>\n", escape_xml(m.source),
                   escape_xml(m.translation));
  h += "<p>Each grid is one head: row i shows where position i attends (white 0, dark blue 1; hover a cell for "
       "its weight). Decoder rows are the decoder's input pieces, starting at &lt;s&gt;.</p>\n";
  for (const auto& map : m.maps) {
    h += fmt::format("<h2>{}, layer {}</h2>\n<div class=\"heads\">\n", map.kind, map.layer);
    const int64_t H = map.weights.size(0);
    std::vector<float> w = map.weights.to_vector<float>();
    const size_t per_head = map.rows.size() * map.cols.size();
    for (int64_t k = 0; k < H; ++k) {
      std::string title = fmt::format("{}, layer {}, head {}", map.kind, map.layer, k);
      h += "<figure>" + head_svg(w.data() + k * per_head, map.rows, map.cols, title) +
           fmt::format("<figcaption>head {}</figcaption></figure>\n", k);
    }
    h += "</div>\n";
  }
  h += "</body></html>\n";
  write_file_atomic(path, h);
}

}  // namespace tapestry::apps
