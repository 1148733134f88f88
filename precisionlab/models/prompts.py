"""Prompts for model-level runs: seeded token ids, or a text file tokenized with the
checkpoint's tokenizer."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from .adapters import ModelError
from .loading import HybridModel

DEFAULT_PROMPT_TOKENS = 32


def prompt_ids(
    hm: HybridModel, prompt: str | os.PathLike | None, *, batch: int,
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS, seed: int = 0,
) -> tuple[torch.Tensor, str]:
    """``(ids (batch, n), description)``.

    ``prompt=None``: ``prompt_tokens`` ids per sequence drawn uniformly from the
    vocabulary by a generator seeded with ``seed``.  A text file: tokenized once with
    the checkpoint's tokenizer; sequence i takes the i-th run of ``n`` consecutive
    tokens, ``n = min(prompt_tokens, tokens // batch)``.
    """
    if batch < 1:
        raise ModelError(f"batch must be positive, got {batch}")
    if prompt_tokens < 1:
        raise ModelError(f"prompt_tokens must be positive, got {prompt_tokens}")
    if prompt is None:
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, hm.vocab_size, (batch, prompt_tokens), generator=gen)
        return ids, f"seeded token ids ({prompt_tokens} per sequence, seed {seed})"
    path = Path(prompt)
    if not path.is_file():
        raise ModelError(f"prompt file not found: {path}")
    tokenizer = hm.tokenizer()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelError(f"cannot read prompt file {path}: {exc}") from None
    tokens = list(tokenizer(text)["input_ids"])
    n = min(prompt_tokens, len(tokens) // batch)
    if n < 1:
        raise ModelError(f"prompt file {path} has {len(tokens)} tokens, fewer than batch {batch}")
    ids = torch.tensor(tokens[: n * batch], dtype=torch.long).reshape(batch, n)
    if int(ids.max()) >= hm.vocab_size:
        raise ModelError(f"the tokenizer of {hm.name} yields ids beyond the model's vocabulary "
                         f"({int(ids.max())} >= {hm.vocab_size})")
    return ids, f"text file {path.resolve()} ({n} tokens per sequence)"
