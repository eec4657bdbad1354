#!/usr/bin/env python3
"""tapestry's encoder-only text model (models/bert.h) as its PyTorch twin, built from
torch.nn.TransformerEncoderLayer (GELU, batch_first; norm_first or BERT's post-norm) with the
masked-LM head tied to the token embedding, for the parity test.

    /usr/bin/python3 tools/reference/bert_ref.py check DUMP.safetensors [--verbose]

DUMP is written by tests/bert_parity_dump.cpp: the weights, a padded batch with BERT-masked
inputs and their labels, class labels, and tapestry's MLM and classifier logits and losses, the
gradients of their sum and the parameters after one AdamW step. Names map as in vit_ref.py
(w_q/w_k/w_v -> in_proj, w_o -> out_proj, ff.w_1/w_2 -> linear1/linear2). Padding is masked out
as keys through src_key_padding_mask. Exit status 1 on any mismatch, each named.
"""
import argparse
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_file import load_safetensors  # noqa: E402
from vit_ref import Comparer, gather, load_dump  # noqa: E402


class Bert(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        d = c["d_model"]
        self.tok_embed = nn.Embedding(c["vocab"], d, padding_idx=c["pad_id"])
        self.pos_embed = nn.Embedding(c["max_len"], d)
        self.embed_norm = nn.LayerNorm(d, eps=c["ln_eps"])
        layer = nn.TransformerEncoderLayer(d, c["heads"], c["d_ff"], 0.0, activation="gelu",
                                           layer_norm_eps=c["ln_eps"], batch_first=True, norm_first=c["norm_first"])
        norm = nn.LayerNorm(d, eps=c["ln_eps"]) if c["norm_first"] else None
        self.encoder = nn.TransformerEncoder(layer, c["layers"], norm=norm, enable_nested_tensor=False)
        self.mlm_dense = nn.Linear(d, d)
        self.mlm_norm = nn.LayerNorm(d, eps=c["ln_eps"])
        self.mlm_bias = nn.Parameter(torch.zeros(c["vocab"]))
        self.classifier = nn.Linear(d, c["classes"])

    def encode(self, ids):
        pos = torch.arange(ids.shape[1])
        x = self.embed_norm(self.tok_embed(ids) + self.pos_embed(pos))
        return self.encoder(x, src_key_padding_mask=ids == self.c["pad_id"])

    def mlm_logits(self, hidden):
        return self.mlm_norm(F.gelu(self.mlm_dense(hidden))) @ self.tok_embed.weight.t() + self.mlm_bias

    def classify(self, ids):
        return self.classifier(self.encode(ids)[:, 0])


def check(path, verbose):
    tensors, meta = load_safetensors(path)
    c = {k: int(meta[k]) for k in ("vocab", "max_len", "classes", "layers", "heads", "d_model", "d_ff", "pad_id")}
    c["ln_eps"], c["norm_first"] = float(meta["ln_eps"]), meta["norm_first"] == "1"
    model = Bert(c)
    loaded = load_dump(model, tensors)
    if loaded is None:
        return 1
    names, start = loaded
    compare = Comparer()

    ids, mlm_labels = tensors["batch.ids"], tensors["batch.mlm_labels"]
    class_ids, labels = tensors["batch.class_ids"], tensors["batch.labels"]
    mlm_logits = model.mlm_logits(model.encode(ids))
    class_logits = model.classify(class_ids)
    real = ids != c["pad_id"]  # padded positions' outputs are computed but mean nothing
    compare("mlm_logits", tensors["out.mlm_logits"], mlm_logits.detach(), valid=real)
    compare("class_logits", tensors["out.class_logits"], class_logits.detach())
    mlm = F.cross_entropy(mlm_logits.reshape(-1, c["vocab"]), mlm_labels.reshape(-1))
    cls = F.cross_entropy(class_logits, labels)
    compare("mlm_loss", tensors["out.mlm_loss"], mlm.detach())
    compare("class_loss", tensors["out.class_loss"], cls.detach())
    (mlm + cls).backward()
    ref = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    got = gather(tensors, "grad.", names, model)
    gmax = max(g.abs().max().item() for g in ref.values())
    for n in ref:
        compare("grad." + n, got[n], ref[n], floor=1e-3 * gmax)

    opt = torch.optim.AdamW(model.parameters(), lr=float(meta["adamw_lr"]), weight_decay=float(meta["weight_decay"]))
    compare.adamw_moves(model, opt, tensors, names, start, got)
    return compare.report(f"bert parity ({'pre' if c['norm_first'] else 'post'}-norm): MLM loss {mlm.item():.6f}, "
                          f"class loss {cls.item():.6f}", verbose)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("dump")
    c.add_argument("--verbose", action="store_true")
    a = ap.parse_args()
    return check(a.dump, a.verbose)


if __name__ == "__main__":
    sys.exit(main())
