"""The tolerant loader (SPEC §6): a map-style PyTorch dataset and collate over packed shards.

:class:`PackedRowsDataset` reads the ``train`` or ``validation`` files of a packed-shard
directory (refusing one without ``_SUCCESS`` or made with another tokenizer) and yields
one dict of tensors per row:

=================  ==========  ======================================================
key                dtype       meaning
=================  ==========  ======================================================
``input_ids``      int64 [L]   tokens
``target_ids``     int64 [L]   next in-document token, PAD elsewhere
``loss_mask``      uint8 [L]   1 where the target carries loss
``doc_ids``        int32 [L]   1..num_docs on the valid prefix, 0 on pad
``segment_ids``    int32 [L]   0..num_docs-1 per document; the pad tail is segment num_docs
``position_ids``   int64 [L]   0, 1, … restarting at every BOS (and at the pad tail)
``cu_seqlens``     int32 [S+1] segment starts + L (flash-attn ``cu_seqlens`` convention)
planes             int64 [L]   only the requested/enabled ones (0 on pad)
=================  ==========  ======================================================

``segment_ids``, ``position_ids`` and ``cu_seqlens`` are derived from ``input_ids`` and
``valid_token_count`` (SPEC §6: never stored as the only truth).

Required columns (:data:`megacpp_core.pack.ROW_SCHEMA`) are strict: missing, wrong
length, id ≥ vocab, or a row breaking the token-level contract → :class:`LoaderError` naming the
file and the row. Optional columns requested through ``planes`` are tolerant: absent or
malformed (wrong length, null, value above the plane's range, non-zero on pad) → the
deterministic default (zeros; an empty chunk list), counted in :attr:`defaulted`. Columns
needed by an enabled feature (:data:`FEATURES`) are strict: absent or malformed →
:class:`LoaderError`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from . import pack
from . import tokenizer as tk

#: Largest legal value per plane (SPEC §4 enrichment: 9 structure categories, clamp 63 for
#: AST depth and sibling index, 256 node-type buckets, uint8 dependency levels).
PLANE_MAX = {"structure_ids": 8, "dep_levels": 255, "ast_depth": 63, "sibling_index": 63, "ast_node_type": 255}
#: Model features and the optional columns they need (strict once enabled).
FEATURES: dict[str, tuple[str, ...]] = {
    "structure_embedding": ("structure_ids",),
    "dependency_levels": ("dep_levels",),
    "ast_embedding": ("ast_depth", "sibling_index", "ast_node_type"),
    "chunk_graph": ("chunk_boundaries", "call_edges", "type_edges"),
    "platform_conditioning": ("platform_ids",),
}


class LoaderError(ValueError):
    """A shard the loader must refuse; the message names the file, row and rule."""


def derived_views(input_ids: np.ndarray, valid: int, bos_id: int = tk.BOS_ID) -> dict[str, np.ndarray]:
    """``segment_ids`` int32, ``position_ids`` int64 and ``cu_seqlens`` int32 of one row.

    Segments start at every BOS of the valid prefix; a PAD tail (``valid < L``) is one
    more segment, so ``cu_seqlens`` always ends at L and covers every position.
    """
    L = input_ids.shape[0]
    starts = np.flatnonzero(input_ids[:valid] == bos_id)
    bounds = np.concatenate([starts, [valid]] if valid < L else [starts]).astype(np.int64)
    cu = np.concatenate([bounds, [L]]).astype(np.int32)
    seg = np.repeat(np.arange(len(bounds), dtype=np.int32), np.diff(cu))
    pos = np.arange(L, dtype=np.int64) - np.repeat(cu[:-1].astype(np.int64), np.diff(cu))
    return {"segment_ids": seg, "position_ids": pos, "cu_seqlens": cu}


class PackedRowsDataset(torch.utils.data.Dataset):
    """Map-style dataset over one split of a packed-shard directory (see module docstring).

    ``planes``: optional columns to yield, tolerant. ``features``: names from
    :data:`FEATURES`; their columns are yielded and strict. ``tokenizer_sha256`` /
    ``vocab_size``: expected tokenizer (refuse a mismatch). Required columns are strict:
    a wrong length, a null, an id ≥ vocab, a row not starting with BOS, a token after the
    valid prefix, a target that is not the next in-document token, a loss_mask value other
    than 0/1 or set where the target is not real, or a ``valid_token_count`` outside
    [1, L] is a :class:`LoaderError` naming the file and row; ``full_contract=True`` also
    reads and checks the stored ``doc_ids`` and ``slack_tokens``, which the loader derives
    instead of reading (the producer and ``megacpp verify`` assert them). Rows are held in memory as numpy
    matrices (rows × L per column). Raises :class:`LoaderError`,
    :class:`megacpp_core.pack.IncompleteShardsError` or
    :class:`megacpp_core.pack.TokenizerMismatchError`.
    """

    def __init__(self, directory: str | Path, split: str = "train", *, planes: Sequence[str] = (),
                 features: Sequence[str] = (), tokenizer_sha256: str | None = None,
                 vocab_size: int | None = None, full_contract: bool = False) -> None:
        self.directory = Path(directory)
        self.full_contract = full_contract
        self.sentinel = pack.read_success(self.directory, tokenizer_sha256, vocab_size)
        unknown = sorted(set(features) - set(FEATURES))
        if unknown:
            raise LoaderError(f"unknown features {unknown}; known: {sorted(FEATURES)}")
        self.strict = tuple(c for f in features for c in FEATURES[f])
        wanted = set(planes) | set(self.strict)
        bad = sorted(wanted - set(pack.OPTIONAL_COLUMNS))
        if bad:
            raise LoaderError(f"unknown optional columns {bad}; known: {list(pack.OPTIONAL_COLUMNS)}")
        self.planes = tuple(c for c in pack.PLANES if c in wanted)
        self.structures = tuple(c for c in pack.OPTIONAL_COLUMNS if c in wanted and c not in pack.PLANES)
        self.L = int(self.sentinel["row_length"])
        self.vocab = int(self.sentinel["vocab_size"])
        self.defaulted: dict[str, int] = {c: 0 for c in wanted}
        files = [f["file"] for f in self.sentinel["files"] if f["split"] == split]
        parts: dict[str, list] = {c: [] for c in ("input_ids", "target_ids", "loss_mask", "valid", *self.planes, *self.structures)}
        for name in files:
            self._load(self.directory / name, parts)
        L = self.L
        def cat(k: str, dt) -> np.ndarray:  # one shard: no copy
            if not parts[k]:
                return np.zeros((0, L), dt)
            return parts[k][0] if len(parts[k]) == 1 else np.concatenate(parts[k])
        self.input_ids = cat("input_ids", np.uint32)
        self.target_ids = cat("target_ids", np.uint32)
        self.loss_mask = cat("loss_mask", np.uint8)
        self.valid = np.concatenate(parts["valid"]) if parts["valid"] else np.zeros(0, np.int32)
        self.plane_data = {p: cat(p, np.uint8) for p in self.planes}
        self.structure_data = {c: [x for part in parts[c] for x in part] for c in self.structures}

    #: Row columns the loader reads: what it yields (``doc_ids``, segments and positions
    #: are derived from ``input_ids``, never read).
    CORE_COLUMNS = ("input_ids", "target_ids", "loss_mask", "valid_token_count", "num_docs")
    #: Read as well with ``full_contract=True``.
    CONTRACT_COLUMNS = ("doc_ids", "slack_tokens")

    def _load(self, path: Path, parts: dict) -> None:
        try:  # pyarrow's own errors name no file ("Unexpected end of stream"): wrap them
            names = pq.read_schema(path).names
            missing = [c for c in pack.ROW_SCHEMA.names if c not in names]
            if missing:
                raise LoaderError(f"{path}: required columns missing: {missing}")
            core = list(self.CORE_COLUMNS) + (list(self.CONTRACT_COLUMNS) if self.full_contract else [])
            table = pq.read_table(path, columns=core + [c for c in (*self.planes, *self.structures) if c in names])
        except LoaderError:
            raise
        except (OSError, pa.ArrowException, ValueError) as e:
            raise LoaderError(f"{path}: unreadable packed shard ({type(e).__name__}: {e}); "
                              f"check it with `megacpp verify {path.parent}`") from e
        n, L = table.num_rows, self.L
        where = str(path)
        try:
            inp, tgt, msk = (pack._matrix(table, c, L, where) if n else np.zeros((0, L), np.uint32)
                             for c in self.CORE_COLUMNS[:3])
            for c in ("valid_token_count", "num_docs"):
                if table.column(c).null_count:
                    raise pack.RowContractError(f"{where}: {c} has {table.column(c).null_count} null values")
            valid = table.column("valid_token_count").to_numpy() if n else np.zeros(0, np.int32)
            if n and self.full_contract:
                pack.check_row_arrays(inp, tgt, msk, pack._matrix(table, "doc_ids", L, where), valid,
                                      table.column("num_docs").to_numpy(), table.column("slack_tokens").to_numpy(),
                                      L, self.vocab, tk.BOS_ID, tk.PAD_ID, where=where)
            elif n:
                pack.check_token_arrays(inp, tgt, msk, valid, L, self.vocab, tk.BOS_ID, tk.PAD_ID, where=where)
        except pack.RowContractError as e:
            raise LoaderError(str(e)) from e
        parts["input_ids"].append(inp.astype(np.uint32, copy=False))
        parts["target_ids"].append(tgt.astype(np.uint32, copy=False))
        parts["loss_mask"].append(msk.astype(np.uint8, copy=False))
        parts["valid"].append(valid)
        in_valid = np.arange(L)[None, :] < valid[:, None] if self.planes else None
        for p in self.planes:
            parts[p].append(self._plane(table, p, in_valid, path))
        for c in self.structures:
            parts[c].append(self._structure(table, c, path))

    def _malformed(self, column: str, path: Path, why: str) -> None:
        if column in self.strict:
            raise LoaderError(f"{path}: column {column} {why}; a feature needing it is enabled")

    def _plane(self, table: pa.Table, p: str, in_valid: np.ndarray, path: Path) -> np.ndarray:
        n, L = table.num_rows, self.L
        out = np.zeros((n, L), dtype=np.uint8)
        if p not in table.column_names:
            self._malformed(p, path, "is absent")
            self.defaulted[p] += n
            return out
        col = table.column(p).combine_chunks()
        lengths = col.value_lengths().fill_null(-1).to_numpy(zero_copy_only=False)
        ok = lengths == L
        raw = np.zeros((n, L), dtype=np.int64)
        if ok.all() and col.null_count == 0:
            raw[:] = col.flatten().to_numpy(zero_copy_only=False).reshape(n, L)
        else:
            for i in np.flatnonzero(ok):
                raw[i] = col[int(i)].values.to_numpy(zero_copy_only=False)
        ok &= ~((raw > PLANE_MAX[p]) | (raw < 0) | ((raw != 0) & ~in_valid)).any(axis=1)
        out = np.where(ok[:, None], raw, 0).astype(np.uint8)
        bad = np.flatnonzero(~ok)
        if bad.size:
            self._malformed(p, path, f"is malformed in row {int(bad[0])} (length, null, range or non-zero pad)")
            self.defaulted[p] += int(bad.size)
        return out

    def _structure(self, table: pa.Table, c: str, path: Path) -> list:
        n = table.num_rows
        if c not in table.column_names:
            self._malformed(c, path, "is absent")
            self.defaulted[c] += n
            return [[] for _ in range(n)]
        values = table.column(c).to_pylist()
        out = []
        valid = table.column("valid_token_count").to_pylist()
        ndocs = table.column("num_docs").to_pylist()
        nchunks = [len(x or []) for x in (table.column("chunk_boundaries").to_pylist() if "chunk_boundaries" in table.column_names else [[]] * n)]
        for i, v in enumerate(values):
            if c == "chunk_boundaries":
                ok = v is not None and all(0 <= s["start"] < s["end"] <= valid[i] for s in v)
            elif c == "platform_ids":
                ok = v is not None and len(v) == ndocs[i]
            else:
                ok = v is not None and all(0 <= e["from"] < nchunks[i] and 0 <= e["to"] < nchunks[i] for e in v)
            if not ok:
                self._malformed(c, path, f"is malformed in row {i}")
                self.defaulted[c] += 1
                v = [[] for _ in range(ndocs[i])] if c == "platform_ids" else []
            out.append(v)
        return out

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def __getitem__(self, i: int) -> dict:
        ids = self.input_ids[i]
        valid = int(self.valid[i])
        views = derived_views(ids, valid)
        doc_ids = np.where(np.arange(self.L) < valid, views["segment_ids"] + 1, 0).astype(np.int32)
        item = {
            "input_ids": torch.from_numpy(ids.astype(np.int64)),
            "target_ids": torch.from_numpy(self.target_ids[i].astype(np.int64)),
            "loss_mask": torch.from_numpy(self.loss_mask[i].copy()),
            "doc_ids": torch.from_numpy(doc_ids),
            "segment_ids": torch.from_numpy(views["segment_ids"]),
            "position_ids": torch.from_numpy(views["position_ids"]),
            "cu_seqlens": torch.from_numpy(views["cu_seqlens"]),
        }
        for p in self.planes:
            item[p] = torch.from_numpy(self.plane_data[p][i].astype(np.int64))
        for c in self.structures:
            item[c] = self.structure_data[c][i]
        return item


def collate(batch: Sequence[dict]) -> dict:
    """Stack a batch: [B, L] tensors; ``cu_seqlens`` int32 concatenated over the flattened
    batch (row b's offsets + b·L, flash-attn varlen convention) with ``max_seqlen`` (int);
    structure columns stay lists (one entry per row)."""
    out: dict = {}
    L = batch[0]["input_ids"].shape[0]
    for k, v in batch[0].items():
        if k == "cu_seqlens":
            parts = [b["cu_seqlens"][:-1] + j * L for j, b in enumerate(batch)]
            cu = torch.cat(parts + [torch.tensor([len(batch) * L], dtype=torch.int32)]).to(torch.int32)
            out["cu_seqlens"] = cu
            out["max_seqlen"] = int((cu[1:] - cu[:-1]).max())
        elif isinstance(v, torch.Tensor):
            out[k] = torch.stack([b[k] for b in batch])
        else:
            out[k] = [b[k] for b in batch]
    return out


def document_attention_mask(segment_ids: torch.Tensor, queries: slice | None = None) -> torch.Tensor:
    """Boolean [.., Q, L] mask for scaled-dot-product attention: causal and within one
    segment (True = may attend). ``queries`` (a step-1 slice of positions; default all, so
    Q = L) gives the mask of those query rows only: a 65,536-token row's whole mask is
    4 GiB of bool, a block of its rows is not."""
    L = segment_ids.shape[-1]
    lo, hi, step = (queries or slice(0, L)).indices(L)
    if step != 1:
        raise ValueError(f"queries must be a step-1 slice, got {queries}")
    q = torch.arange(lo, hi)
    causal = torch.arange(L)[None, :] <= q[:, None]
    return (segment_ids[..., lo:hi, None] == segment_ids[..., None, :]) & causal


def reset_causal_conv(x: torch.Tensor, weight: torch.Tensor, segment_ids: torch.Tensor) -> torch.Tensor:
    """Depthwise causal 1-D convolution over [B, C, L] that never reads across a segment
    start: tap k of position t uses ``x[t-k]`` only when it lies in t's segment (zero
    otherwise, as at the start of a sequence). ``weight`` is [C, K]."""
    K = weight.shape[-1]
    out = torch.zeros_like(x)
    for k in range(K):
        shifted = torch.nn.functional.pad(x, (k, 0))[..., : x.shape[-1]]
        seg_shift = torch.nn.functional.pad(segment_ids, (k, 0), value=-1)[..., : x.shape[-1]]
        same = (seg_shift == segment_ids).unsqueeze(-2)
        out = out + weight[:, K - 1 - k, None] * torch.where(same, shifted, torch.zeros_like(shifted))
    return out
