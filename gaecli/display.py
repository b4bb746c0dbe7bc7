"""Paths, URIs and text as gaecli prints them: :func:`display`, the one place that makes a
name safe to show on a terminal, in a report, a JSON document or Parquet metadata.

A name is opened and written as it is (the bytes of a non-UTF-8 file name, a URI with its
credentials); what is *shown* of it goes through :func:`display`, which

- redacts credentials: the user information of a URI (``s3://key:secret@bucket/x`` →
  ``s3://***@bucket/x``) and the values of query parameters that carry secrets
  (``secret_key=…``, ``session_token=…``, ``access_key=…`` → ``secret_key=***``);
- escapes the bytes of a file name that are no UTF-8 (Python holds them as surrogate
  escapes, :func:`os.fsdecode`) as ``\\xNN``, the byte itself (``bad\\xff\\xfe.parquet``);
- escapes control characters (ANSI escapes, line breaks, C1 controls, the bidirectional
  overrides) visibly: ``\\x1b``, ``\\n``, ``\\r``, ``\\t``, ``\\u202e``.

It is idempotent (displayed text displays as itself), so a message may be passed through
it again where it is printed.
"""

from __future__ import annotations

import re

_USER_INFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?:[^\s@/?#]*:[^\s@]*|[^\s@/?#:]+)@")
"""``scheme://user:password@`` or ``scheme://token@``: a password may hold ``/`` (an
unencoded object-store secret), so up to the ``@``; user information without a ``:``
stops at the host part's end."""

_SECRET_PARAMETER = re.compile(
    r"(?P<name>(?<=[?&;])[A-Za-z0-9_.\-]*(?:key|secret|token|password|passwd|credentials?|signature|sig))"
    r"=(?P<value>[^&#\s]*)",
    re.IGNORECASE,
)
"""A query parameter whose name says it carries a secret (pyarrow's S3 ``access_key``,
``secret_key``, ``session_token``; Azure's ``account_key``, SAS ``sig`` …)."""

REDACTED = "***"

_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_SURROGATES = re.compile("[\ud800-\udfff]")


def _escape(match: re.Match) -> str:
    character = match.group()
    code = ord(character)
    if character in _NAMED_ESCAPES:
        return _NAMED_ESCAPES[character]
    if 0xDC80 <= code <= 0xDCFF:  # a byte that is no UTF-8, as os.fsdecode keeps it
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def display(value, *, controls: bool = True) -> str:
    """``value`` (a str, a :class:`pathlib.Path`, a :class:`gaecli.io.filesystem.RemotePath`,
    or any object: its ``str()``) as text safe to print or store: credentials redacted,
    undecodable bytes as ``\\xNN``, control characters escaped. ``controls`` False leaves
    control characters as they are (for a JSON document, whose encoder escapes them itself);
    credentials and undecodable bytes are handled all the same."""
    text = value if isinstance(value, str) else str(value)
    if "@" in text:
        text = _USER_INFO.sub(lambda match: match["scheme"] + REDACTED + "@", text)
    if "=" in text:
        text = _SECRET_PARAMETER.sub(lambda match: f"{match['name']}={REDACTED}", text)
    return (_CONTROLS if controls else _SURROGATES).sub(_escape, text)
