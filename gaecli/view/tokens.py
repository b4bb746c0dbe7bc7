"""The text of a sample's tokens on the sample page: a token-id column decoded with
``--tokenizer`` (a ``tokenizer.json`` through the ``tokenizers`` library, or a tokenizer
directory through ``transformers`` where installed), else the ids themselves or a column of
token strings, else none (the page shows positions)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import pyarrow as pa

from gaecli.errors import GAEUsageError

TOKEN_COLUMNS = ("response_tokens", "response_token_ids", "response_ids", "token_ids", "tokens")
"""The token columns looked for, in order, when ``--tokens-col`` is not given."""


def load_tokenizer(path: str):
    """A decoder of one token id (``decode([id])``) from ``path``: a ``tokenizer.json`` file
    (``tokenizers``), or a directory (``transformers``' ``AutoTokenizer`` where installed,
    else its ``tokenizer.json``). Raises :class:`GAEUsageError` (exit 2) naming what to install
    or what is missing."""
    where = Path(path)
    if where.is_dir():
        try:
            from transformers import AutoTokenizer
        except ImportError:
            where = where / "tokenizer.json"
        else:
            try:
                return AutoTokenizer.from_pretrained(str(where), local_files_only=True)
            except (OSError, ValueError) as error:
                raise GAEUsageError(f"--tokenizer {path}: cannot load it ({error})") from error
    if not where.is_file():
        raise GAEUsageError(f"--tokenizer {path}: no such file (give a tokenizer.json or a tokenizer directory)")
    try:
        from tokenizers import Tokenizer
    except ImportError as error:
        raise GAEUsageError("--tokenizer needs the tokenizers library: pip install tokenizers") from error
    try:
        return Tokenizer.from_file(str(where))
    except Exception as error:  # the library's own errors are plain Exceptions
        raise GAEUsageError(f"--tokenizer {path}: cannot read it ({str(error).splitlines()[0]})") from error


class TokenText:
    """Where the tokens' text comes from: ``tokenizer`` (a path, loaded once) and ``column``
    (the token column; None: the first of :data:`TOKEN_COLUMNS` a file has)."""

    def __init__(self, tokenizer: Optional[str] = None, column: Optional[str] = None) -> None:
        self.column = column
        self.decoder = None if tokenizer is None else load_tokenizer(tokenizer)

    def column_in(self, schema: pa.Schema) -> Optional[str]:
        """The token column of a file of ``schema`` (a list column), or None."""
        names = (self.column,) if self.column is not None else TOKEN_COLUMNS
        for name in names:
            if name in schema.names and pa.types.is_list(schema.field(name).type):
                return name
            if name in schema.names and pa.types.is_large_list(schema.field(name).type):
                return name
        return None

    def pieces(self, table: pa.Table, length: int) -> tuple[Optional[list[str]], str]:
        """The text of each of the ``length`` tokens of the one row of ``table`` and where it
        came from (``tokenizer``, ``ids``, ``column``), or (None, ``positions``) when there is
        no token column or its length is not the response's."""
        name = self.column_in(table.schema)
        if name is None:
            return None, "positions"
        tokens = table.column(name)[0].as_py() or []
        if len(tokens) != length:
            return None, "positions"
        if pa.types.is_string(table.schema.field(name).type.value_type):
            return [str(token) for token in tokens], "column"
        if self.decoder is None:
            return [str(token) for token in tokens], "ids"
        return [self.decoder.decode([int(token)]) for token in tokens], "tokenizer"
