#!/usr/bin/env python3
"""Writes an llm.c token file of N tokens drawn uniformly from [0, VOCAB) (Python's random, seed 1
unless SEED is given): a 256-int32 header (20240520, 1, N, zeros) and N uint16 tokens. The
benchmark scripts that compare fourway with PyTorch feed both sides from it.

    random_tokens.py OUT VOCAB N [SEED]
"""
import random
import struct
import sys


def main(argv):
    if len(argv) not in (4, 5):
        sys.exit(__doc__.strip())
    out, vocab, n = argv[1], int(argv[2]), int(argv[3])
    if not 0 < vocab <= 65536 or n <= 0:
        sys.exit(f"random_tokens.py: VOCAB must be in [1, 65536] and N positive, got {vocab}, {n}")
    random.seed(int(argv[4]) if len(argv) == 5 else 1)
    tokens = [random.randrange(vocab) for _ in range(n)]
    with open(out, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack(f"<{n}H", *tokens))


if __name__ == "__main__":
    main(sys.argv)
