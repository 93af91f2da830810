"""Token ids of whole texts, handed from one stage to a later one in the same process.

The chunk stage encodes every kept file whole (its exact token budgets need the counts),
and most files fit in one chunk whose text is the whole file (692 of 824 documents,
1.03 M of 1.83 M tokens on ``default``); the tokenize stage then encodes those same texts
again. When the two run in one Dagster step (the step group ``chunk__tokenize__…``, one
process), chunk puts each file's ids here, and the ids of each document of a file it
split (built by the file's span counter from the whole file's ids and the short pieces
it encoded at the document's ends, :meth:`megacpp_core.span_count.SpanCounter.ids`), and
tokenize takes the ids of every document whose text is one of them instead of encoding
it again. Encoding is deterministic (and the counter's pieces are exact), so the
ids are the ones tokenize would compute; tokenize still decodes every document and
compares it with its text (its round-trip check), hit or miss.

The memo is keyed by the tokenizer's sha256 and the text itself (a dict lookup: the text's
hash, then a comparison of equal texts), holds one shard's texts at a time (:meth:`IdsMemo.begin`
drops what an earlier shard left), and at most :data:`MAX_TOKENS` ids (4 bytes each). It
keeps the texts it is keyed by alive from chunk to tokenize: one shard's kept text, which
the chunk stage held anyway, and the documents of its split files (slices of those texts:
at most as much again). A stage that runs alone, in another process or pod, finds
it empty and encodes as before.
"""

from __future__ import annotations

from .memo import TextMemo

#: Ids the memo holds at most (uint32, 4 bytes each: 256 MiB). xl's largest shard has
#: about 9 M tokens; a put beyond the limit is dropped (its text is encoded again later).
MAX_TOKENS = 64 << 20


class IdsMemo(TextMemo):
    """``{text: uint32 ids}`` under one tokenizer sha256 (the scope), at most ``max_tokens``
    ids (see the module docstring and :class:`~megacpp_core.memo.TextMemo`). Thread-safe:
    chunk puts from its encoding thread."""

    def __init__(self, max_tokens: int = MAX_TOKENS):
        super().__init__(max_tokens, len)


#: The process's memo (chunk puts, tokenize takes).
MEMO = IdsMemo()
