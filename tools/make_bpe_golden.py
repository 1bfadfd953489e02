#!/usr/bin/env python3
"""Writes tests/golden/bpe_tiny_v1/: a small byte-level BPE tokenizer in Hugging Face's files and
reference encodings of a fixed multilingual text, for fourway's tokenizer tests.

GPT-2's own tokenizer files cannot be downloaded on fourway's machines, so this script trains a
GPT-2-style byte-level BPE with Hugging Face `tokenizers` on text every Debian system ships
(`/usr/share/common-licenses/*`, regular files in name order) plus a multilingual paragraph
written below, and encodes the test texts with two independent implementations: `tokenizers`
itself and `tiktoken` built from the same ranks. It stops unless both agree on every case. The
pre-tokenisation pieces come from the `regex` module, as GPT-2's own encoder.py splits text;
tiktoken's ids of the pieces one by one must equal its ids of the whole text.

  python3 -m venv /tmp/bpe-venv
  /tmp/bpe-venv/bin/pip install tokenizers==0.23.3 tiktoken==0.14.0 regex==2026.12.2
  /tmp/bpe-venv/bin/python tools/make_bpe_golden.py          # rewrites tests/golden/bpe_tiny_v1/

Files written (see docs/golden.md):
  tokenizer.json   `Tokenizer.save`: ByteLevel pre-tokenizer and decoder, the BPE model's vocab
                   and merges, `<|endoftext|>` as an added special token (the last id, as GPT-2)
  vocab.json       the same vocabulary as GPT-2 ships it: JSON with \\u escapes, `<|endoftext|>`
                   included (the BPE model's own vocab.json leaves added tokens out)
  merges.txt       `#version: 0.2`, then one merge "left right" per line, by rank
  reference.txt    one case per line (format below)

reference.txt, after `#` comment lines (texts are hex-encoded UTF-8 bytes, so any byte fits):
  encode NAME HEX : ID...     special tokens recognised (tokenizers' encode; tiktoken's encode
                              with allowed_special="all")
  ordinary NAME HEX : ID...   special tokens as plain text (tokenizers with
                              encode_special_tokens=True; tiktoken's encode_ordinary)
  decode NAME ID... : HEX     the decoded text, invalid UTF-8 replaced by U+FFFD (tokenizers'
                              decode; tiktoken's decode, errors="replace")
  pieces NAME : HEX...        regex.findall(GPT-2's pattern, text): the pieces BPE runs on
Training is deterministic here (checked: two runs give identical files).
"""
import json
import os
import random
import sys

import regex
import tiktoken
import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "golden",
                   "bpe_tiny_v1")
VOCAB_SIZE = 1280  # 256 bytes + 1024 merges; <|endoftext|> is added after, as id 1280
EOT = "<|endoftext|>"
GPT2_PATTERN = (r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|"""
                r"""\s+""")

# Trained on with the licences so that multi-byte characters get merges (some of which end in
# the middle of a character: the byte-level pieces decode has to cope with).
TRAIN_EXTRA = (
    "Les modèles de langue découpent le texte en morceaux ; à Zürich, Kraków et Málaga "
    "aussi. Grüße aus Köln, señor! Ελληνικά γράμματα και Русский язык тоже. "
    "中文文本和日本語の文章、ひらがなとカタカナ。한국어 문장도 있습니다. "
    "Числа 1234 und ٣٤٥ und ½. 🙂🙂 👍 🎉\n")
# So that every contraction of the pattern is a token: a wrongly split contraction changes ids.
TRAIN_CONTRACTIONS = "I'm sure they've said we're fine; you'll see what he'd do, don't worry.\n"

# The fixed test text: English with contractions, accents (composed and decomposed), Greek,
# Cyrillic, CJK, emoji (skin tone, ZWJ family, flag), digits of several scripts, runs of spaces,
# tabs and newlines, non-ASCII spaces, code, and <|endoftext|> between documents.
TEXT = (
    "It's a test. We're here, they've gone, I'm sure you'll see what he'd do. DON'T shout; "
    "O'Neil's dog isn't ours.\n"
    "Café, naïve, résumé, Ærøskøbing, Straße. Ça va? ¿Qué tal? Cafe\u0301 (decomposed).\n"
    "Ελληνικά: καλημέρα. Русский текст, ёлка.\n"
    "中文的文本。日本語のテキスト、カタカナ。한국어 텍스트.\n"
    "Emoji: 🙂👍🏽 👨\u200d👩\u200d👧 🇩🇪 ✨!!\n"
    "Numbers 1234567890, 3.14159, 2024-05-20, ٣٤٥, ½ and Ⅻ; x2 v1.0\n"
    "a  b   c\t\td\n\n\n  e    \n"
    "non\u00a0breaking and ideographic\u3000space\n"
    "def f(x):\n    return x**2  # comment\n"
    "quotes: 's'''t 'll 'LL \u2019s ''\n"
    f"{EOT}The next document.{EOT}\n"
    "A partial <|endoftext and a stray |> stay text.   ")

EDGE_CASES = [
    ("empty", ""), ("space", " "), ("spaces3", "   "), ("newlines3", "\n\n\n"),
    ("word_trailing_spaces", "a  "), ("leading_spaces", "  a"), ("tabs", "\t\t"),
    ("contraction_alone", "'s"), ("contraction_upper", "I'M"), ("contraction_mid", "x'sy"),
    ("apostrophes", "'''"), ("space_newline_word", "  \n  x"), ("nbsp", "a\u00a0b"),
    ("ideographic_space", "\u3000"), ("digits", "12345678"), ("arabic_digits", "٣٤٥"),
    ("roman_numeral", "Ⅻ"), ("fraction", "½"), ("combining", "e\u0301e\u0301"),
    ("zwj", "👨\u200d👩\u200d👧"), ("eot_twice", f"{EOT}{EOT}"),
    ("eot_partial", "<|endoftext"), ("eot_inside", f"a{EOT}b"), ("eot_spaced", f" {EOT} "),
    ("space_punct", " !!"), ("newline_space_word", "\n hello"), ("cr_lf", "a\r\nb\r\n"),
    ("four_byte", "𝒳𝒴"), ("nel", "a\u0085b"), ("line_separator", "a\u2028b"),
    ("unit_separator", "a\u001fb"),  # str.isspace() is true, White_Space is not
    ("space_unit_separator", " \u001fx \u001c\u001d\n"),
]


def bytes_to_unicode():
    """GPT-2's table: printable bytes map to themselves, the others to U+0100 upward."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def training_text():
    folder = "/usr/share/common-licenses"
    parts = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, encoding="utf-8") as f:
                parts.append(f.read())
    if not parts:
        sys.exit(f"make_bpe_golden: no licence text under {folder}")
    return parts + [TRAIN_EXTRA] * 20 + [TRAIN_CONTRACTIONS] * 60


def random_text(seed=47, length=1500):
    """A seeded jumble of the characters the pattern treats differently, to reach its corners."""
    palette = (list("abcXYZ") + list("0123") + list(" " * 6) + list("\n\t") + list("'sStdmlrev") +
               list(".,!?-_#()") + ["é", "ß", "中", "語", "🙂", "\u00a0", "\u3000", "٣", "½",
                                    "\u0301", "’", "<|", "|>", EOT])
    rng = random.Random(seed)
    return "".join(rng.choice(palette) for _ in range(length))


def train():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[])
    tok.train_from_iterator(training_text(), trainer=trainer)
    tok.add_special_tokens([EOT])
    return tok


def tiktoken_of(vocab, eot_id):
    to_byte = {c: b for b, c in bytes_to_unicode().items()}
    ranks = {bytes(to_byte[c] for c in token): i for token, i in vocab.items() if token != EOT}
    return tiktoken.Encoding("bpe_tiny_v1", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={EOT: eot_id})


def main():
    tok = train()
    vocab = tok.get_vocab(with_added_tokens=True)
    eot_id = vocab[EOT]
    if eot_id != len(vocab) - 1 or sorted(vocab.values()) != list(range(len(vocab))):
        sys.exit("make_bpe_golden: expected dense ids with <|endoftext|> last")
    enc = tiktoken_of(vocab, eot_id)
    os.makedirs(OUT, exist_ok=True)
    tok.save(os.path.join(OUT, "tokenizer.json"))
    tok.model.save(OUT)  # vocab.json (rewritten below) and merges.txt
    with open(os.path.join(OUT, "vocab.json"), "w", encoding="ascii") as f:
        json.dump(dict(sorted(vocab.items(), key=lambda kv: kv[1])), f, ensure_ascii=True)

    cases = [("text", TEXT), ("random", random_text())] + EDGE_CASES
    cases += [(f"line{i}", line) for i, line in enumerate(TEXT.splitlines(keepends=True))]
    lines = [f"# bpe_tiny_v1 reference: tools/make_bpe_golden.py, tokenizers {tokenizers.__version__}"
             f", tiktoken {tiktoken.__version__}; both agree on every case",
             "# encode NAME HEX : IDS | ordinary NAME HEX : IDS | decode NAME IDS : HEX | "
             "pieces NAME : HEX..."]
    decode_inputs = []
    for name, text in cases:
        hf = tok.encode(text).ids
        tt = enc.encode(text, allowed_special="all")
        if hf != tt:
            sys.exit(f"make_bpe_golden: encode of {name!r} differs:\n tokenizers {hf}\n tiktoken {tt}")
        tok.encode_special_tokens = True
        hf_plain = tok.encode(text).ids
        tok.encode_special_tokens = False
        tt_plain = enc.encode_ordinary(text)
        if hf_plain != tt_plain:
            sys.exit(f"make_bpe_golden: ordinary encode of {name!r} differs:\n {hf_plain}\n {tt_plain}")
        if tok.decode(hf, skip_special_tokens=False) != text:
            sys.exit(f"make_bpe_golden: {name!r} does not round-trip through tokenizers")
        pieces = regex.findall(GPT2_PATTERN, text)
        if "".join(pieces) != text or [i for p in pieces for i in enc.encode_ordinary(p)] != tt_plain:
            sys.exit(f"make_bpe_golden: regex's pieces of {name!r} disagree with tiktoken")
        lines.append(f"pieces {name} : {' '.join(p.encode('utf-8').hex() for p in pieces)}")
        hexed = text.encode("utf-8").hex()
        lines.append(f"encode {name} {hexed} : {' '.join(map(str, hf))}")
        lines.append(f"ordinary {name} {hexed} : {' '.join(map(str, hf_plain))}")
        if name == "text":
            decode_inputs = hf
    # decode: every token of the text alone (pieces of characters among them), the prefixes of
    # the text's first 200 tokens that end inside a character (every 4th), the special token
    decodes = [(f"token{i}", [t]) for i, t in enumerate(decode_inputs)]
    cut = [n for n in range(1, 200) if "\ufffd" in tok.decode(decode_inputs[:n])]
    decodes += [(f"prefix{n}", decode_inputs[:n]) for n in cut[::4]]
    decodes += [("eot_alone", [eot_id])]
    # seeded random id sequences: characters broken in every way (a lead byte followed by
    # another lead, continuation bytes alone, ...)
    rng = random.Random(4747)
    decodes += [(f"random{k}", [rng.randrange(eot_id + 1) for _ in range(12)]) for k in range(40)]
    partial = 0
    for name, ids in decodes:
        hf = tok.decode(ids, skip_special_tokens=False)
        tt = enc.decode(ids, errors="replace")
        if hf != tt:
            sys.exit(f"make_bpe_golden: decode of {name} {ids} differs: {hf!r} vs {tt!r}")
        partial += "\ufffd" in hf
        lines.append(f"decode {name} {' '.join(map(str, ids))} : {hf.encode('utf-8').hex()}")
    with open(os.path.join(OUT, "reference.txt"), "w", encoding="ascii") as f:
        f.write("\n".join(lines) + "\n")
    sizes = {n: os.path.getsize(os.path.join(OUT, n)) for n in sorted(os.listdir(OUT))}
    print(f"vocab {len(vocab)} (<|endoftext|> = {eot_id}), merges {len(vocab) - 257}; "
          f"{len(cases)} texts, {len(decodes)} decodes ({partial} with U+FFFD); files {sizes}")


if __name__ == "__main__":
    main()
