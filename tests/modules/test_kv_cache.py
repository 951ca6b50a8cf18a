"""KVCache: the preallocated buffers, and incremental decoding through MultiHeadAttention and
the Decoder stack (one token at a time equals the whole sequence at once)."""

from __future__ import annotations

import pytest
import torch

from attnkit.modules import Decoder, KVCache, MultiHeadAttention
from attnkit.modules.kv_cache import PaddingCache, positions_from_mask

TOL = dict(atol=1e-5, rtol=0)


def test_update_appends_and_returns_everything_so_far():
    cache = KVCache(2, 3, 5, 4)
    assert cache.length == 0 and cache.max_len == 5
    k1, v1 = torch.randn(2, 3, 2, 4), torch.randn(2, 3, 2, 4)
    k, v = cache.update(k1, v1)
    assert torch.equal(k, k1) and torch.equal(v, v1) and cache.length == 2
    k2, v2 = torch.randn(2, 3, 1, 4), torch.randn(2, 3, 1, 4)
    k, v = cache.update(k2, v2)
    assert torch.equal(k, torch.cat([k1, k2], 2)) and torch.equal(v, torch.cat([v1, v2], 2))
    gk, gv = cache.get()
    assert torch.equal(gk, k) and torch.equal(gv, v) and cache.length == 3


def test_buffers_follow_dtype():
    cache = KVCache(1, 2, 4, 3, dtype=torch.bfloat16)
    assert cache.k.dtype == cache.v.dtype == torch.bfloat16
    k, _ = cache.update(torch.randn(1, 2, 1, 3, dtype=torch.bfloat16), torch.zeros(1, 2, 1, 3))
    assert k.dtype == torch.bfloat16


def test_overflow_raises():
    cache = KVCache(1, 2, 4, 3)
    cache.update(torch.zeros(1, 2, 3, 3), torch.zeros(1, 2, 3, 3))
    with pytest.raises(ValueError, match=r"5 positions exceed the cache's max_len=4"):
        cache.update(torch.zeros(1, 2, 2, 3), torch.zeros(1, 2, 2, 3))
    assert cache.length == 3  # a failed update leaves the cache as it was
    cache.update(torch.zeros(1, 2, 1, 3), torch.zeros(1, 2, 1, 3))
    assert cache.length == 4


@pytest.mark.parametrize(
    "k_shape,v_shape",
    [
        ((2, 2, 1, 3), (2, 2, 1, 3)),  # batch
        ((1, 4, 1, 3), (1, 4, 1, 3)),  # heads
        ((1, 2, 1, 5), (1, 2, 1, 5)),  # head_dim
        ((1, 2, 1, 3), (1, 2, 2, 3)),  # k and v disagree
    ],
)
def test_wrong_shapes_raise(k_shape, v_shape):
    cache = KVCache(1, 2, 4, 3)
    with pytest.raises(ValueError, match=r"expected k and v of shape \(1, 2, T, 3\)"):
        cache.update(torch.zeros(k_shape), torch.zeros(v_shape))


def test_reorder_selects_rows():
    cache = KVCache(3, 2, 4, 2)
    k, v = torch.randn(3, 2, 2, 2), torch.randn(3, 2, 2, 2)
    cache.update(k, v)
    index = torch.tensor([2, 0, 0])  # beams: keep row 2, and row 0 twice
    cache.reorder(index)
    gk, gv = cache.get()
    assert torch.equal(gk, k[index]) and torch.equal(gv, v[index])
    # Later steps write into the reordered rows only.
    k2, v2 = torch.randn(3, 2, 1, 2), torch.randn(3, 2, 1, 2)
    gk, gv = cache.update(k2, v2)
    assert torch.equal(gk, torch.cat([k[index], k2], 2))
    assert torch.equal(gv, torch.cat([v[index], v2], 2))
    cache.reorder(torch.tensor([1]))  # the batch may shrink
    assert cache.get()[0].shape == (1, 2, 3, 2)
    assert torch.equal(cache.get()[0], torch.cat([k[index], k2], 2)[1:2])


def test_self_attention_one_token_at_a_time_equals_causal_attention():
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2).eval()
    x = torch.randn(2, 5, 8)
    full, full_w = mha(x, causal=True, return_weights=True)
    cache = KVCache(2, 2, 5, 4)
    steps = []
    for t in range(5):
        out, w = mha(x[:, t : t + 1], causal=True, cache=cache, return_weights=True)
        torch.testing.assert_close(w[..., 0, :], full_w[..., t, : t + 1], **TOL)
        steps.append(out)
    torch.testing.assert_close(torch.cat(steps, 1), full, **TOL)
    # A prefill of several positions, then single steps (the gpt-fast split).
    cache = KVCache(2, 2, 5, 4)
    prefill = mha(x[:, :3], causal=True, cache=cache).output
    rest = [mha(x[:, t : t + 1], causal=True, cache=cache).output for t in (3, 4)]
    torch.testing.assert_close(torch.cat([prefill, *rest], 1), full, **TOL)


def test_cross_attention_cache_is_filled_once_and_reused():
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2).eval()
    x, context = torch.randn(2, 3, 8), torch.randn(2, 6, 8)
    expected = mha(x, context).output
    cache = KVCache(2, 2, 6, 4)
    first = mha(x[:, :1], context, cache=cache).output
    assert cache.length == 6
    # Later steps read the cached keys/values, not the context they are given.
    later = mha(x[:, 1:], torch.zeros_like(context), cache=cache).output
    assert cache.length == 6
    torch.testing.assert_close(torch.cat([first, later], 1), expected, **TOL)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_with_caches_equals_full_decode(norm_first):
    torch.manual_seed(0)
    dec = Decoder(
        2,
        final_norm=norm_first,
        d_model=8,
        num_heads=2,
        d_ff=16,
        dropout=0.0,
        norm_first=norm_first,
    ).eval()
    tgt, memory = torch.randn(3, 4, 8), torch.randn(3, 5, 8)
    keep = torch.arange(5)[None, None, :] < torch.tensor([5, 3, 1])[:, None, None]  # (B, 1, S)
    full = dec(tgt, memory, memory_mask=keep).hidden
    caches = dec.init_cache(3, 4, 5)
    assert len(caches) == 2 and caches[0][0].max_len == 4 and caches[0][1].max_len == 5
    steps = [
        dec(tgt[:, t : t + 1], memory, memory_mask=keep, caches=caches).hidden for t in range(4)
    ]
    torch.testing.assert_close(torch.cat(steps, 1), full, **TOL)
    with pytest.raises(ValueError, match=r"max_len=4"):
        dec(tgt[:, :1], memory, memory_mask=keep, caches=caches)


# --------------------------------------------------------------------------- PaddingCache


def test_positions_from_mask_are_hugging_faces_cumsum_minus_one():
    keep = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0], [0, 1, 0, 1, 1]], dtype=torch.bool)
    pos = positions_from_mask(keep, 5)
    hf = keep.long().cumsum(-1) - 1  # transformers' generate(): cumsum(attention_mask) - 1
    assert torch.equal(pos[keep], hf[keep])
    # Padding gets the row's last real position (0 before any): in range, never attended.
    assert pos.tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 2, 2], [0, 0, 0, 1, 2]]
    assert positions_from_mask(None, 3, start=4).tolist() == [[4, 5, 6]]
    counts = torch.tensor([2, 0, 5])
    assert positions_from_mask(keep[:, :2], 2, start=counts).tolist() == [[1, 1], [0, 1], [4, 5]]


def test_padding_cache_records_slots_and_counts():
    cache = PaddingCache(2, 6)
    assert cache.update(None, 2) is None  # no padding yet: no mask needed
    keep = torch.tensor([[True, False], [False, True]])
    mask = cache.update(keep, 2)
    assert mask.shape == (2, 1, 4)
    assert mask[:, 0].tolist() == [[True, True, True, False], [True, True, False, True]]
    assert cache.counts.tolist() == [3, 3] and cache.length == 4
    assert cache.positions(None, 1).tolist() == [[3], [3]]
    mask = cache.update(None, 1)  # once padding was seen, the mask is always returned
    assert mask[:, 0, -1].tolist() == [True, True]
    cache.reorder(torch.tensor([1, 1, 0]))
    assert cache.batch_size == 3 and cache.counts.tolist() == [4, 4, 4]
    assert cache.keep[:, :5].tolist()[0] == [True, True, False, True, True]


def test_padding_cache_refuses_overflow_and_wrong_shapes():
    cache = PaddingCache(2, 3)
    cache.update(None, 2)
    with pytest.raises(ValueError, match=r"4 positions exceed the cache's max_len=3"):
        cache.update(None, 2)
    assert cache.length == 2 and cache.counts.tolist() == [2, 2]  # unchanged
    with pytest.raises(ValueError, match=r"expected keep of shape \(2, 1\), got \(1, 1\)"):
        cache.update(torch.ones(1, 1, dtype=torch.bool), 1)
    with pytest.raises(ValueError, match=r"batch_size and max_len must be >= 1"):
        PaddingCache(0, 3)


def test_padding_cache_reorder_of_a_full_batch_is_in_place():
    cache = PaddingCache(3, 4)
    cache.update(torch.tensor([[True], [False], [True]]), 1)
    keep, counts = cache.keep, cache.counts
    cache.reorder(torch.tensor([1, 1, 2]))
    assert cache.keep is keep and cache.counts is counts  # same buffers (beam search)
    assert cache.keep[:, 0].tolist() == [False, False, True] and counts.tolist() == [0, 0, 1]


# --------------------------------------------------------------------------- sliding window


def _slot_values(n, heads=1, dim=2):
    """(1, heads, n, dim) keys whose every entry is its slot number: easy to follow."""
    return torch.arange(n, dtype=torch.float32)[None, None, :, None].expand(1, heads, n, dim)


def test_a_window_keeps_at_most_window_slots_in_a_ring():
    cache = KVCache(1, 1, 10, 2, window=3)
    assert cache.capacity == 3 and cache.max_len == 10 and cache.k.shape == (1, 1, 3, 2)
    slots = _slot_values(10)
    k, _ = cache.update(slots[:, :, :2], slots[:, :, :2])  # 2 slots: all kept, in order
    assert k[0, 0, :, 0].tolist() == [0, 1]
    k, _ = cache.update(slots[:, :, 2:3], slots[:, :, 2:3])
    assert k[0, 0, :, 0].tolist() == [0, 1, 2]
    k, _ = cache.update(slots[:, :, 3:4], slots[:, :, 3:4])  # the ring: 3 replaces 0
    assert k[0, 0, :, 0].tolist() == [3, 1, 2]
    mask = torch.tensor([[[True, False, True, False]]])  # over slots 0..3
    assert cache.select_keys(mask)[0, 0].tolist() == [False, False, True]  # slots 3, 1, 2
    k, _ = cache.update(slots[:, :, 4:5], slots[:, :, 4:5])
    assert k[0, 0, :, 0].tolist() == [3, 4, 2]
    gk, _ = cache.get()
    assert gk[0, 0, :, 0].tolist() == [2, 3, 4]  # in slot order
    # Several new slots: the kept ones in order, then the new ones; the last 3 stored.
    k, _ = cache.update(slots[:, :, 5:9], slots[:, :, 5:9])
    assert k[0, 0, :, 0].tolist() == [2, 3, 4, 5, 6, 7, 8]
    mask = torch.arange(9)[None, None] % 2 == 0  # over slots 0..8
    assert cache.select_keys(mask)[0, 0].tolist() == [True, False, True, False, True, False, True]
    assert cache.k[0, 0, :, 0].tolist() == [6, 7, 8]  # slot s at s % 3
    k, _ = cache.update(slots[:, :, 9:10], slots[:, :, 9:10])
    assert k[0, 0, :, 0].tolist() == [9, 7, 8] and cache.length == 10
    with pytest.raises(ValueError, match=r"11 positions exceed the cache's max_len=10"):
        cache.update(slots[:, :, :1], slots[:, :, :1])


def test_a_long_prompt_into_an_empty_window():
    cache = KVCache(1, 1, 8, 2, window=3)
    slots = _slot_values(8)
    k, v = cache.update(slots[:, :, :6], slots[:, :, :6])
    assert k[0, 0, :, 0].tolist() == list(range(6)) and torch.equal(k, v)
    assert cache.k[0, 0, :, 0].tolist() == [3, 4, 5]
    k, _ = cache.update(slots[:, :, 6:7], slots[:, :, 6:7])
    assert k[0, 0, :, 0].tolist() == [6, 4, 5]


def test_a_window_longer_than_max_len_is_a_plain_cache():
    cache = KVCache(2, 1, 4, 2, window=100)
    assert cache.capacity == 4
    k, _ = cache.update(torch.randn(2, 1, 4, 2), torch.randn(2, 1, 4, 2))
    mask = torch.ones(2, 1, 4, dtype=torch.bool)
    assert cache.select_keys(mask) is mask and k.shape == (2, 1, 4, 2)


def test_reorder_of_a_ring_keeps_every_slot():
    cache = KVCache(3, 1, 10, 2, window=2)
    rows = torch.arange(3, dtype=torch.float32)[:, None, None, None]
    for s in range(5):
        cache.update(rows * 100 + s + torch.zeros(3, 1, 1, 2), torch.zeros(3, 1, 1, 2))
    cache.reorder(torch.tensor([2, 0, 0]))
    assert cache.k[:, 0, :, 0].tolist() == [[204, 203], [4, 3], [4, 3]]
    cache.reorder(torch.tensor([1]))
    assert cache.k[:, 0, :, 0].tolist() == [[4, 3]]


@pytest.mark.parametrize("window", [0, -1, 2.0, True])
def test_a_bad_window_is_refused(window):
    with pytest.raises(ValueError, match=r"KVCache: window must be an integer >= 1 or None"):
        KVCache(1, 1, 4, 2, window=window)


def test_a_numpy_integer_window_is_taken_as_the_sizes_are():
    """batch_size, max_len and the other sizes took numpy integers; the window did not."""
    np = pytest.importorskip("numpy")
    cache = KVCache(1, 1, np.int64(6), 2, window=np.int64(3))
    assert type(cache.window) is int and cache.window == 3 and cache.capacity == 3
    keys = torch.arange(5.0).view(1, 1, 5, 1).expand(1, 1, 5, 2)  # (B, H, T, hd)
    k, _ = cache.update(keys, keys)
    assert k[0, 0, :, 0].tolist() == [0, 1, 2, 3, 4]  # all new keys, for the new queries
    assert sorted(cache.k[0, 0, :, 0].tolist()) == [2, 3, 4]  # the ring holds the last 3


@pytest.mark.parametrize("window", [None, 3])
def test_both_layouts_hold_the_same_keys_and_values(window):
    """Head-major and position-major storage differ only in memory: every update, ring
    write, get and reorder (a beam step with a spare buffer passed on, then a shrinking
    batch) returns the same tensors."""
    g = torch.Generator().manual_seed(3)
    heads = KVCache(4, 2, 8, 3, window=window)
    positions = KVCache(4, 2, 8, 3, window=window, layout="positions")
    assert (heads.layout, positions.layout) == ("heads", "positions")
    assert heads.nbytes == positions.nbytes == 2 * 4 * 2 * heads.capacity * 3 * 4
    spare = None
    for t, index in [(2, [3, 3, 0, 1]), (1, [1, 0, 2, 2]), (1, [0, 0, 1, 3]), (2, [2, 1])]:
        k, v = (torch.randn(heads.k.shape[0], 2, t, 3, generator=g) for _ in "kv")
        got_h, got_p = heads.update(k, v), positions.update(k, v)
        for a, b in zip(got_h, got_p, strict=True):
            assert torch.equal(a, b)
        assert heads.select_keys(torch.arange(heads.length)).tolist() == (
            positions.select_keys(torch.arange(positions.length)).tolist()
        )
        heads.reorder(torch.tensor(index))
        spare = positions.reorder(torch.tensor(index), spare)
        for a, b in zip(heads.get(), positions.get(), strict=True):
            assert torch.equal(a, b)
    assert heads.k.shape == positions.k.shape == (2, 2, heads.capacity, 3)


def test_a_position_major_beam_step_reuses_its_buffers():
    """After the first beam step the reorder allocates nothing, also when the batch shrinks:
    the keys go to the spare's first rows, the values to the buffer the keys left, and the
    values' old buffer is handed back whole."""
    cache = KVCache(3, 2, 6, 4, layout="positions")
    cache.update(torch.randn(3, 2, 2, 4), torch.randn(3, 2, 2, 4))
    spare = cache.reorder(torch.tensor([2, 0, 1]))
    held = {cache.k.data_ptr(), cache.v.data_ptr(), spare.data_ptr()}
    k_before = cache.k.clone()
    spare = cache.reorder(torch.tensor([1, 1, 0]), spare)
    assert {cache.k.data_ptr(), cache.v.data_ptr(), spare.data_ptr()} == held
    assert torch.equal(cache.k[:, :, :2], k_before[[1, 1, 0], :, :2])
    k_before = cache.k.clone()
    spare = cache.reorder(torch.tensor([2, 0]), spare)  # a sentence done: fewer rows
    assert {cache.k.data_ptr(), cache.v.data_ptr(), spare.data_ptr()} == held
    assert cache.k.shape == (2, 2, 6, 4) and spare.shape == (3, 6, 2, 4)
    assert torch.equal(cache.k[:, :, :2], k_before[[2, 0], :, :2])


def test_an_unknown_layout_is_refused():
    with pytest.raises(ValueError, match=r"layout must be one of \('heads', 'positions'\)"):
        KVCache(1, 1, 2, 2, layout="rows")


@pytest.mark.parametrize("layout", ["heads", "positions"])
@pytest.mark.parametrize("rows", [[1, 0], [1]])
def test_reorder_keeps_gradients(layout, rows):
    """A cache filled under autograd (a model trained through its cache) reorders with the
    gradient flowing back to the keys and values that filled it, in either layout, for a
    beam step and for a shrinking batch."""
    cache = KVCache(2, 1, 3, 2, layout=layout)
    k = torch.randn(2, 1, 2, 2, requires_grad=True)
    v = torch.randn(2, 1, 2, 2, requires_grad=True)
    cache.update(k, v)
    cache.reorder(torch.tensor(rows))
    keys, values = cache.get()
    (keys.sum() + 2 * values.sum()).backward()
    counts = torch.bincount(torch.tensor(rows), minlength=2).float()  # uses of each old row
    torch.testing.assert_close(k.grad, counts[:, None, None, None].expand_as(k))
    torch.testing.assert_close(v.grad, 2 * counts[:, None, None, None].expand_as(v))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((2, 4, -1, 8), r"KVCache: max_len must be an integer >= 1, got -1"),  # torch's error
        ((2, 4, 8.0, 8), r"KVCache: max_len must be an integer >= 1, got 8.0"),
        ((2, 0, 8, 8), r"KVCache: num_heads must be an integer >= 1, got 0"),
        ((True, 4, 8, 8), r"KVCache: batch_size must be an integer >= 0, got True"),
        ((2, 4, 8, -8), r"KVCache: head_dim must be an integer >= 1, got -8"),
    ],
)
def test_bad_sizes_are_named(args, message):
    with pytest.raises(ValueError, match=message):
        KVCache(*args)
