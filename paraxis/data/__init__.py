"""Training data: tokenizers, token files, raw corpora, blends and the per-rank loader."""
