"""The defaults and limits of ``gae identify``, defined once (light: the command line's help reads them)."""

DEFAULT_TOLERANCE = 1e-5
"""A sample is reproduced when every trainable token's |stored − computed| ≤ tol · (1 + |stored|):
1e-5 leaves room for a trainer's float32 arithmetic over long responses (docs/identify.md)."""

DEFAULT_SAMPLE_ROWS = 4096
"""Rows read by default: the first of the input, in input order (0 reads every row)."""

DEFAULT_SAMPLE_TOKENS = 4_000_000
"""At most this many tokens are read with the sample (the rows that reach it end the sample)."""

FIT_ROWS = 64
"""γ and λ are fitted on at most this many rows of the sample, each with at least
:data:`MIN_FIT_TOKENS` trainable tokens, the first in input order."""

FIT_TOKENS = 16_384
"""…and at most this many tokens of them."""

MIN_FIT_TOKENS = 3
"""The trainable tokens a row needs to take part in the fit of γ and λ (a one-token row says
nothing of λ, a two-token row little)."""
