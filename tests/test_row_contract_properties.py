"""Property tests of the packed-row contract (SPEC §6): for random document lengths, FIM
rates and row lengths every packed row passes the checker; any single-field corruption of
a row is refused by the producer's checker, the tolerant loader (strictly) and the verify
gate."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from megacpp_checks.packed import verify_packed_dir
from megacpp_core import fim, pack
from megacpp_core import tokenizer as tk
from megacpp_core.loader import LoaderError, PackedRowsDataset

V = 4096  # vocabulary of the synthetic documents; ids 64.. are ordinary tokens


def _docs(lengths: list[int], seed: int) -> list[pack.PackInput]:
    rng = np.random.default_rng(seed)
    out = []
    for i, n in enumerate(lengths):
        ids = np.concatenate([[tk.BOS_ID], rng.integers(64, V, size=n - 1)]).astype(np.uint32)
        out.append(pack.PackInput(ids, f"s/f{i}.c#0", "s", "r" * 64, f"f{i}.c", 0))
    return out


def _rows(lengths, L, rate, spm, seed) -> pa.Table:
    lengths = [min(n, L) for n in lengths]
    docs, _ = fim.apply_fim_all(_docs(lengths, seed), fim.FimConfig(rate=rate, spm_share=spm, seed=seed,
                                                                    doc_comment_policy="keep"), L)
    return pack.build_rows(docs, L, tk.BOS_ID, tk.PAD_ID)


DOCS = st.lists(st.integers(min_value=2, max_value=400), min_size=1, max_size=30)


@settings(max_examples=80, deadline=None)
@given(lengths=DOCS, L=st.integers(min_value=16, max_value=512), rate=st.floats(0, 1), spm=st.floats(0, 1),
       seed=st.integers(0, 2**16))
def test_every_packed_row_passes_the_contract(lengths, L, rate, spm, seed):
    rows = _rows(lengths, L, rate, spm, seed)
    s = pack.check_rows(rows, L, V, tk.BOS_ID, tk.PAD_ID)
    assert s["docs"] == len(lengths)
    assert s["rows"] >= -(-s["tokens"] // L)  # never fewer rows than the fill bound
    assert rows.column("pack_id").to_pylist() == list(range(rows.num_rows))


def _corrupt(row: dict, field: str, rng: np.random.Generator, L: int) -> bool:
    """Apply one corruption of ``field`` to ``row`` in place; False when it cannot apply."""
    valid = row["valid_token_count"]
    ids = row["input_ids"]
    body = [k for k in range(1, valid) if ids[k] != tk.BOS_ID]
    if field == "input_id_out_of_vocab" and body:
        ids[int(rng.choice(body))] = V + 7
    elif field == "first_not_bos":
        ids[0] = 100
    elif field == "token_in_pad_tail" and valid < L:
        ids[valid] = 100
    elif field == "target_not_next" and body:
        k = int(rng.choice(body)) - 1
        row["target_ids"][k] = (row["target_ids"][k] % (V - 65)) + 65 if row["target_ids"][k] != tk.PAD_ID else 99
    elif field == "loss_on_pad" and valid < L:
        row["loss_mask"][valid] = 1
    elif field == "loss_not_binary":
        row["loss_mask"][0] = 2
    elif field == "valid_count":
        row["valid_token_count"] = valid + 1 if valid < L else valid - 1
    elif field == "num_docs":
        row["num_docs"] += 1
    elif field == "doc_ids":
        row["doc_ids"][valid - 1] += 1
    elif field == "slack":
        row["slack_tokens"] += 1
    else:
        return False
    return True


FIELDS = ["input_id_out_of_vocab", "first_not_bos", "token_in_pad_tail", "target_not_next", "loss_on_pad",
          "loss_not_binary", "valid_count", "num_docs", "doc_ids", "slack"]


@pytest.mark.parametrize("field", FIELDS)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=DOCS, L=st.integers(min_value=16, max_value=256), rate=st.floats(0, 1), seed=st.integers(0, 2**16),
       which=st.integers(0, 1000))
def test_any_single_field_corruption_is_refused(tmp_path_factory, field, lengths, L, rate, seed, which):
    rows = _rows(lengths, L, rate, 0.5, seed)
    data = rows.to_pylist()
    # the first row from ``which`` on where the corruption applies (a pad-tail corruption
    # needs a row that is not full; most packed rows are): fewer inputs thrown away
    n = len(data)
    applied = any(_corrupt(data[(which + k) % n], field, np.random.default_rng(seed), L) for k in range(n))
    assume(applied)
    bad = pa.Table.from_pylist(data, schema=rows.schema)
    with pytest.raises(pack.RowContractError):
        pack.check_rows(bad, L, V, tk.BOS_ID, tk.PAD_ID)
    out = tmp_path_factory.mktemp("corrupt")
    sha = "ab" * 32
    pack.write_shards(bad, out, row_length=L, vocab_size=V, tokenizer_sha256=sha, validation_fraction=0.0)
    with pytest.raises(LoaderError):
        PackedRowsDataset(out, full_contract=True, tokenizer_sha256=sha, vocab_size=V)
    report = verify_packed_dir(out, out=lambda m: None, tokenizer_sha256=sha, vocab_size=V)
    assert not report.ok
