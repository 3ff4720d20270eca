"""Decoding in pieces gives exactly what json.loads gives, for any document and chunk size."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from anex_agent.selection.jsonpieces import loads_in_pieces

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12))
documents = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=6),
                                                          st.dictionaries(st.text(max_size=6), inner, max_size=6)),
                         max_leaves=40)


@settings(max_examples=300, deadline=None)
@given(documents, st.sampled_from([1, 2, 3, 7, 64, 1 << 20]), st.integers(0, 4), st.booleans())
def test_same_value_as_json_loads(doc, chunk, depth, indent):
    data = json.dumps(doc, indent=2 if indent else None, ensure_ascii=False).encode()
    assert loads_in_pieces(data, depth=depth, chunk=chunk) == json.loads(data)
    parts = [data[i:i + chunk] for i in range(0, len(data), chunk)]  # as received, UTF-8 cut anywhere
    assert loads_in_pieces(parts, depth=depth) == json.loads(data)


def test_a_number_cut_at_a_chunk_boundary_is_read_whole():
    assert loads_in_pieces(b'{"offers": [12345, 678]}', chunk=14) == {"offers": [12345, 678]}
    assert loads_in_pieces(b"1234567", chunk=2) == 1234567


@pytest.mark.parametrize("bad", [b"", b"{", b'{"a" 1}', b'{"a": 1,}', b"[1 2]", b'{"a": 1} x', b"[1,]", b"{1: 2}",
                                 b'{"offers": [{"id": 1}', b"\xff"])
@pytest.mark.parametrize("chunk", [1, 3, 1 << 20])
def test_malformed_documents_raise_value_error(bad, chunk):
    with pytest.raises(ValueError):
        loads_in_pieces(bad, chunk=chunk)


def test_no_piece_decodes_more_than_one_offer(monkeypatch):
    """The point of the module: each C-level decode call sees one offer (or one chunk), not the answer."""
    from anex_agent.selection import jsonpieces

    sizes: list[int] = []
    real = jsonpieces._DECODER.raw_decode

    class Spy:
        def raw_decode(self, text, pos):
            value, end = real(text, pos)
            sizes.append(end - pos)
            return value, end

    monkeypatch.setattr(jsonpieces, "_DECODER", Spy())
    offers = [{"id": i, "gpu_name": "RTX 4090", "dph_total": 0.5 + i} for i in range(2000)]
    data = json.dumps({"offers": offers}).encode()
    assert loads_in_pieces(data, chunk=4096) == {"offers": offers}
    assert max(sizes) < 100 < len(data)


def test_dismantle_empties_nested_documents():
    from anex_agent.selection.jsonpieces import dismantle

    doc = {"offers": [{"id": i, "tags": list(range(5))} for i in range(2500)], "big": [[0] * 1500], "n": 1}
    dismantle(doc, piece=100)
    assert doc == {}
    items = [[1] * 300, {"a": [2] * 300}]
    dismantle(items, piece=100)
    assert items == []
