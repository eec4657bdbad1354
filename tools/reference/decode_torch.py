#!/usr/bin/env python3
"""Translates with a tapestry translation run in PyTorch, with a key/value cache (incremental
decoding, as fairseq does): the PyTorch side of the decoding race (tools/decode-race.sh).

    /usr/bin/python3 tools/reference/decode_torch.py --checkpoint runs/multi30k --input test.de \
        [--beam 4 | --greedy] [--alpha 0.6] [--batch 64] [--threads 2] [--out hyps.en] [--json] [--encoder torch]

The model is transformer_ref.py's (the parity test's twin), loaded from the run's weights
(model.avg.safetensors when the run averaged) and spm.model; with --encoder torch its encoder
runs as torch.nn.TransformerEncoder instead, whose inference fast path skips the padding. The search is tapestry's
(models/decode.cpp) step for step, so both print the same translations up to float rounding:
  - each step runs the decoder on the newest token only; every layer keeps its self-attention keys
    and values (appended each step, reordered by beam origin) and its encoder keys and values
    (projected once per batch);
  - a sentence's output may be at most its source length + 50 tokens; padding is never an output;
  - greedy: every row takes its arg-max until eos;
  - beam: the 2K best continuations over a sentence's K beams; an eos among the top K ends a
    hypothesis scored log P / ((5 + len) / 6)^alpha; a sentence stops once it has K endings and no
    live beam can beat the worst of them at the longest allowed length.
A finished sentence leaves the batch (its rows, memory and caches dropped), as in fairseq and
tapestry.
Batches are consecutive input lines, as `tapestry translate --batch N` takes them. The timer
covers tokenizing, decoding and detokenizing every sentence (not loading the model).
"""
import argparse
import gzip
import json
import math
import os
import sys
import time
import warnings

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_file import load_safetensors  # noqa: E402
from transformer_ref import Transformer, positional_encoding  # noqa: E402

PAD, BOS, EOS = 0, 2, 3  # apps/data/subword.h
MAX_EXTRA = 50           # models/transformer.h DecodeOptions::max_extra
# models/transformer.cpp TransformerConfig::named
CONFIGS = {"tiny": (64, 4, 128, 2, 2), "small": (256, 8, 1024, 3, 3), "base": (512, 8, 2048, 6, 6),
           "big": (1024, 16, 4096, 6, 6)}


def load_model(run_dir, weights):
    path = os.path.join(run_dir, weights) if weights else os.path.join(run_dir, "model.avg.safetensors")
    if not weights and not os.path.exists(path):
        path = os.path.join(run_dir, "model.safetensors")
    tensors, meta = load_safetensors(path)
    import sentencepiece
    sp = sentencepiece.SentencePieceProcessor(model_file=os.path.join(run_dir, "spm.model"))
    d, h, f, le, ld = CONFIGS[meta["config"]]
    V = sp.get_piece_size()
    c = dict(src_vocab=V, tgt_vocab=V, d_model=d, heads=h, d_ff=f, enc_layers=le, dec_layers=ld, pad_id=PAD,
             pre_norm=meta.get("pre_norm") == "1", share_embeddings=True, dropout=0.0)
    model = Transformer(c)
    # tapestry saves a tied weight once, under its first name (src_embed.weight).
    for tied in ("tgt_embed.weight", "generator.weight"):
        tensors.setdefault(tied, tensors["src_embed.weight"])
    model.load_state_dict(tensors, strict=True)
    return model.eval(), sp, path


def heads(x, attn):
    """[B, T, D] -> [B, H, T, d_k]."""
    return x.view(x.size(0), -1, attn.heads, attn.d_k).transpose(1, 2)


def attend(attn, q, k, v, key_pad):
    """Scaled dot-product attention of new queries q [B, H, 1, d_k] over k, v [B, H, S, d_k]."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(attn.d_k)
    if key_pad is not None:
        scores = scores.masked_fill(key_pad, -1e9)
    out = F.softmax(scores, dim=-1) @ v
    return attn.w_o(out.transpose(1, 2).reshape(q.size(0), -1, attn.heads * attn.d_k))


class IncrementalDecoder:
    """The decoder run one position at a time over a batch of rows with per-layer caches."""

    def __init__(self, model, memory, src_pad):
        self.model, self.src_pad = model, src_pad
        self.mem_kv = [(heads(l.src_attn.w_k(memory), l.src_attn), heads(l.src_attn.w_v(memory), l.src_attn))
                       for l in model.decoder]
        self.self_kv = [None] * len(model.decoder)

    def reorder(self, rows, with_memory=False):
        """Keeps the rows `rows` (in that order) of the self-attention caches, and with_memory
        also of the encoder's keys, values and padding mask (a finished sentence's rows leave)."""
        self.self_kv = [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in self.self_kv]
        if with_memory:
            self.mem_kv = [(k.index_select(0, rows), v.index_select(0, rows)) for k, v in self.mem_kv]
            self.src_pad = self.src_pad.index_select(0, rows)

    def step(self, tokens, position):
        """tokens [rows] at `position` -> log-probs [rows, V] of the next token."""
        m, d = self.model, self.model.c["d_model"]
        x = m.tgt_embed(tokens[:, None]) * math.sqrt(d) + positional_encoding(position + 1, d)[position]
        for i, layer in enumerate(m.decoder):
            def self_attn(h):
                a = layer.self_attn
                k, v = heads(a.w_k(h), a), heads(a.w_v(h), a)
                if self.self_kv[i] is not None:
                    k, v = torch.cat([self.self_kv[i][0], k], 2), torch.cat([self.self_kv[i][1], v], 2)
                self.self_kv[i] = (k, v)
                return attend(a, heads(a.w_q(h), a), k, v, None)

            def src_attn(h):
                a = layer.src_attn
                return attend(a, heads(a.w_q(h), a), *self.mem_kv[i], self.src_pad)

            if layer.pre_norm:
                x = x + self_attn(layer.norm1(x))
                x = x + src_attn(layer.norm2(x))
                x = x + layer.ff(layer.norm3(x))
            else:
                x = layer.norm1(x + self_attn(x))
                x = layer.norm2(x + src_attn(x))
                x = layer.norm3(x + layer.ff(x))
        if m.c["pre_norm"]:
            x = m.decoder_norm(x)
        lp = F.log_softmax(m.generator(x[:, 0]), dim=-1)
        lp[:, PAD] = -math.inf
        return lp


def torch_encoder(model):
    """The model's encoder as torch.nn.TransformerEncoder, whose inference fast path (PyTorch 1.12+,
    post-norm layers) packs a padded batch into a nested tensor, so no padded position is
    computed: what tapestry's encoder does in eval mode (Note [Packed rows], nn/layers.cpp)."""
    # PyTorch 1.13 warns on every batch that nested tensors are a prototype API.
    warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors is in prototype stage")
    c = model.c
    layer = torch.nn.TransformerEncoderLayer(c["d_model"], c["heads"], c["d_ff"], dropout=0.0, batch_first=True,
                                             norm_first=c["pre_norm"])
    enc = torch.nn.TransformerEncoder(layer, len(model.encoder), enable_nested_tensor=True)
    with torch.no_grad():
        for mine, ref in zip(enc.layers, model.encoder):
            a = ref.self_attn
            mine.self_attn.in_proj_weight.copy_(torch.cat([a.w_q.weight, a.w_k.weight, a.w_v.weight]))
            mine.self_attn.in_proj_bias.copy_(torch.cat([a.w_q.bias, a.w_k.bias, a.w_v.bias]))
            mine.self_attn.out_proj.load_state_dict(a.w_o.state_dict())
            mine.linear1.load_state_dict(ref.ff.w_1.state_dict())
            mine.linear2.load_state_dict(ref.ff.w_2.state_dict())
            mine.norm1.load_state_dict(ref.norm1.state_dict())
            mine.norm2.load_state_dict(ref.norm2.state_dict())
    return enc.eval()


def encode_batch(model, ids, fast_encoder=None):
    S = max(1, max(len(s) for s in ids))
    src = torch.full((len(ids), S), PAD, dtype=torch.long)
    for i, s in enumerate(ids):
        src[i, :len(s)] = torch.tensor(s, dtype=torch.long)
    if fast_encoder is None:
        memory, src_pad = model.encode(src)
    else:
        pad = src == PAD
        memory = fast_encoder(model.embed(model.src_embed, src), src_key_padding_mask=pad)
        if memory.size(1) < S:  # the nested tensor comes back as long as the longest sentence
            memory = F.pad(memory, (0, 0, 0, S - memory.size(1)))
        if model.c["pre_norm"]:
            memory = model.encoder_norm(memory)
        src_pad = pad[:, None, None, :]
    return memory, src_pad, [len(s) for s in ids]


def greedy(model, ids, fast_encoder=None):
    memory, src_pad, lens = encode_batch(model, ids, fast_encoder)
    B = len(ids)
    dec = IncrementalDecoder(model, memory, src_pad)
    tokens = torch.full((B,), BOS, dtype=torch.long)
    out, active = [[] for _ in range(B)], list(range(B))  # row r decodes sentence active[r]
    for t in range(max(lens) + MAX_EXTRA):
        best = dec.step(tokens, t).argmax(-1).tolist()
        keep = []
        for r, b in enumerate(active):
            out[b].append(best[r])
            if best[r] != EOS and len(out[b]) < lens[b] + MAX_EXTRA:
                keep.append(r)
        if not keep:
            break
        tokens = torch.tensor([best[r] for r in keep], dtype=torch.long)
        if len(keep) < len(active):
            active = [active[r] for r in keep]
            dec.reorder(torch.tensor(keep, dtype=torch.long), with_memory=True)
    return out


def penalty(length, alpha):
    return ((5.0 + length) / 6.0) ** alpha


def beam(model, ids, K, alpha, fast_encoder=None):
    memory0, src_pad0, lens = encode_batch(model, ids, fast_encoder)
    B, NEG = len(ids), -math.inf
    rep = torch.arange(B).repeat_interleave(K)
    dec = IncrementalDecoder(model, memory0.index_select(0, rep), src_pad0.index_select(0, rep))
    active = list(range(B))  # rows a*K .. a*K+K-1 decode sentence active[a]
    prefixes = [[BOS] for _ in range(B * K)]
    scores = torch.full((B * K,), NEG, dtype=torch.float64)
    scores[::K] = 0.0
    finished = [[] for _ in range(B)]
    for t in range(max(lens) + MAX_EXTRA):
        lp = dec.step(torch.tensor([p[-1] for p in prefixes], dtype=torch.long), t)
        V = lp.size(1)
        # The 2K best continuations of each sentence over all its beams, in one topk.
        top_s, top_i = (lp.double() + scores[:, None]).view(len(active), K * V).topk(2 * K, dim=-1)
        top_s, top_i = top_s.tolist(), top_i.tolist()
        origin, next_active, next_prefixes, next_scores = [], [], [], []
        gen_len = t + 1
        for a, b in enumerate(active):
            at_limit, live = gen_len >= lens[b] + MAX_EXTRA, 0
            rows, row_prefixes, row_scores = [a * K] * K, [None] * K, [NEG] * K
            for c in range(2 * K):
                if live >= K:
                    break
                s, idx = top_s[a][c], top_i[a][c]
                if s == NEG:
                    break
                k, tok = divmod(idx, V)
                prefix = prefixes[a * K + k]
                if tok == EOS or at_limit:
                    if c < K:
                        finished[b].append((s / penalty(gen_len, alpha), prefix[1:] + [tok]))
                    continue
                rows[live], row_prefixes[live], row_scores[live] = a * K + k, prefix + [tok], s
                live += 1
            for k in range(live, K):
                row_prefixes[k] = prefixes[a * K] + [PAD]
            done = at_limit or live == 0
            if len(finished[b]) >= K:
                finished[b].sort(key=lambda h: -h[0])
                best_live = max(row_scores)
                bound = NEG if best_live == NEG else best_live / penalty(lens[b] + MAX_EXTRA, alpha)
                if bound <= finished[b][K - 1][0]:
                    done = True
            if done:
                if not finished[b]:
                    finished[b].append((scores[a * K].item(), prefixes[a * K][1:]))
                continue
            next_active.append(b)
            origin += rows
            next_prefixes += row_prefixes
            next_scores += row_scores
        dropped = len(next_active) < len(active)
        active, prefixes = next_active, next_prefixes
        if not active:
            break
        scores = torch.tensor(next_scores, dtype=torch.float64)
        dec.reorder(torch.tensor(origin, dtype=torch.long), with_memory=dropped)
    return [max(f, key=lambda h: h[0])[1] for f in finished]


def read_lines(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True, help="a run folder of `tapestry train --task multi30k`")
    ap.add_argument("--weights", default="", help="weights file in the run folder (default: as tapestry translate)")
    ap.add_argument("--input", required=True, help="sentences, one per line (plain or .gz)")
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--greedy", action="store_true")
    ap.add_argument("--alpha", type=float, default=0.6)
    ap.add_argument("--batch", type=int, default=50, help="sentences decoded together")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--out", default="", help="write the translations here (default: standard output)")
    ap.add_argument("--json", action="store_true", help="print the timing as one JSON line on stderr")
    ap.add_argument("--encoder", choices=["ref", "torch"], default=os.environ.get("DECODE_TORCH_ENCODER", "ref"),
                    help="ref: transformer_ref.py's layers; torch: torch.nn.TransformerEncoder with its fast path "
                         "(default: $DECODE_TORCH_ENCODER, else ref)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model, sp, path = load_model(a.checkpoint, a.weights)
    fast_encoder = torch_encoder(model) if a.encoder == "torch" else None
    lines = read_lines(a.input)
    K = 1 if a.greedy else a.beam
    t0 = time.perf_counter()
    out = []
    with torch.inference_mode():
        for start in range(0, len(lines), a.batch):
            ids = [sp.encode(s) for s in lines[start:start + a.batch]]
            hyps = greedy(model, ids, fast_encoder) if K == 1 else beam(model, ids, K, a.alpha, fast_encoder)
            out += [sp.decode([i for i in h if i > EOS]) for h in hyps]
    seconds = time.perf_counter() - t0
    text = "".join(s + "\n" for s in out)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    stats = dict(side="pytorch", weights=path, sentences=len(lines), seconds=seconds,
                 sentences_per_s=len(lines) / seconds, search="greedy" if K == 1 else f"beam {K}",
                 batch=a.batch, threads=a.threads, encoder=a.encoder, torch=torch.__version__)
    print(json.dumps(stats) if a.json else
          f"decode_torch: {len(lines)} sentences in {seconds:.2f} s ({len(lines) / seconds:.1f} sentences/s)",
          file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
