#!/usr/bin/env python3
"""Makes the SentencePiece fixture of tests/test_lm.cpp with Debian's python3-sentencepiece (the
reference implementation), and prints the reference ids of the test's strings.

    /usr/bin/python3 tools/reference/spm_ref.py write tests/data/llama_spm/tokenizer.model
    /usr/bin/python3 tools/reference/spm_ref.py ids tests/data/llama_spm/tokenizer.model

write: a small BPE model trained as Llama 2's tokenizer.model was (byte fallback, digits split,
no normalization, whitespace kept; unk 0, bos 1, eos 2, no pad) on the first 3000 lines of
Multi30k's English training text, 400 pieces. ids: the encodings of STRINGS as JSON lines.
"""
import gzip
import io
import json
import os
import sys

import sentencepiece as spm

STRINGS = ["Hello world", "A man in a blue shirt is standing on a ladder.", "  two  spaces and 12345 digits",
           "caf\u00e9 na\u00efve \u4e16\u754c \U0001f642", "tabs\tand\nnewlines", "", "zzzz qqq xyz!?"]


def main():
    mode, path = sys.argv[1], sys.argv[2]
    if mode == "write":
        here = os.path.dirname(os.path.abspath(__file__))
        corpus = os.path.join(here, "..", "..", "..", "shared", "data", "multi30k", "train.en.gz")
        with gzip.open(corpus, "rt", encoding="utf-8") as f:
            lines = [next(f).rstrip("\n") for _ in range(3000)]
        model = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(lines), model_writer=model, model_type="bpe", vocab_size=400,
            byte_fallback=True, split_digits=True, normalization_rule_name="identity",
            remove_extra_whitespaces=False, allow_whitespace_only_pieces=True, character_coverage=0.9995,
            unk_id=0, bos_id=1, eos_id=2, pad_id=-1, num_threads=1, minloglevel=2)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(model.getvalue())
    sp = spm.SentencePieceProcessor(model_file=path)
    for s in STRINGS:
        print(json.dumps([s, sp.encode(s)], ensure_ascii=True))


if __name__ == "__main__":
    main()
