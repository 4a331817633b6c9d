import numpy as np
import pytest

from specrt.bundle.contract import ModelDims
from specrt.errors import ContextLengthError
from specrt.runtime.kvcache import KVCache
from specrt.runtime.masks import causal_mask, tree_mask

DIMS = ModelDims(num_layers=2, num_heads=4, num_kv_heads=2, head_dim=3, hidden_size=12, vocab_size=10)


def filled(cache: KVCache, n: int, start_value: float = 0.0) -> None:
    """Write n entries where a backend's forward writes them: right after the valid ones."""
    end = cache.length + n
    for layer in range(cache.num_layers):
        k, v = cache.keys[layer][:, cache.length:end], cache.values[layer][:, cache.length:end]
        k[...] = start_value + np.arange(n)[None, :, None, None]
        v[...] = -k
    cache.advance(n)


def test_past_and_slots_are_contiguous_ranges_at_the_bound_addresses():
    c = KVCache(DIMS, 16, np.float32)
    filled(c, 5)
    k = c.keys[0][:, : c.length]  # what a backend binds as past_key.0
    assert k.shape == (1, 5, 2, 3) and k.flags.c_contiguous
    assert np.shares_memory(k, c.keys[0]) and k.ctypes.data == c.key_ptrs[0]
    slot_k = c.keys[1][:, c.length:c.length + 3]  # where new_key.1 is written
    assert slot_k.flags.c_contiguous and slot_k.shape == (1, 3, 2, 3)
    assert slot_k.ctypes.data == c.keys[1].ctypes.data + 5 * 2 * 3 * 4 == c.key_ptrs[1] + c.length * c.row_bytes
    assert c.values[1][:, c.length:].ctypes.data == c.value_ptrs[1] + c.length * c.row_bytes


def test_rollback_is_a_length_move():
    c = KVCache(DIMS, 16, np.float32)
    filled(c, 6)
    before = c.keys[0].copy()
    c.truncate(2)
    assert c.length == 2
    assert np.array_equal(c.keys[0], before)  # nothing erased or copied
    with pytest.raises(ValueError):
        c.truncate(3)


def test_overflow_raises_instead_of_truncating():
    c = KVCache(DIMS, 8, np.float32)
    filled(c, 6)
    c.ensure_room(2)
    with pytest.raises(ContextLengthError, match="max context of 8"):
        c.ensure_room(3)


def test_compact_moves_an_accepted_tree_path():
    c = KVCache(DIMS, 16, np.float32)
    filled(c, 4)  # past
    filled(c, 6, start_value=100)  # six tree nodes at 4..9 valued 100..105
    c.compact(4, [0, 2, 5])
    assert c.length == 7
    assert c.keys[1][0, 4:7, 0, 0].tolist() == [100, 102, 105]
    assert c.values[0][0, 4:7, 1, 2].tolist() == [-100, -102, -105]
    assert c.keys[0][0, :4, 0, 0].tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        c.compact(4, [2, 1])


@pytest.mark.parametrize("keep, want", [([], []), ([0], [100]), ([0, 1], [100, 101]), ([0, 1, 4], [100, 101, 104]),
                                        ([1, 3], [101, 103])])
def test_compact_keeps_a_prefix_in_place_and_moves_the_rest(keep, want):
    c = KVCache(DIMS, 16, np.float32)
    filled(c, 4)
    filled(c, 6, start_value=100)
    c.compact(4, keep)
    assert c.length == 4 + len(keep)
    assert c.keys[0][0, 4:c.length, 1, 1].tolist() == want and c.values[1][0, 4:c.length, 0, 0].tolist() == [-w for w in want]
    assert c.keys[1][0, :4, 0, 0].tolist() == [0, 1, 2, 3]


def test_a_heads_major_cache_compacts_along_its_position_axis():
    """The GroupQueryAttention layout [1, H_kv, max_context, D]: the same moves as the seq-major cache."""
    seq, heads = KVCache(DIMS, 16, np.float32), KVCache(DIMS, 16, np.float32, heads_major=True)
    assert heads.keys[0].shape == (1, 2, 16, 3) and heads.key_ptrs[0] == heads.keys[0].ctypes.data
    rng = np.random.default_rng(0)
    for s_buf, h_buf in zip((*seq.keys, *seq.values), (*heads.keys, *heads.values)):
        s_buf[...] = rng.standard_normal(s_buf.shape)
        h_buf[...] = s_buf.transpose(0, 2, 1, 3)
    seq.length = heads.length = 10
    seq.compact(4, [0, 2, 5])
    heads.compact(4, [0, 2, 5])
    assert heads.length == seq.length == 7
    for s_buf, h_buf in zip((*seq.keys, *seq.values), (*heads.keys, *heads.values)):
        np.testing.assert_array_equal(h_buf[:, :, :7].transpose(0, 2, 1, 3), s_buf[:, :7])


def test_causal_mask():
    m = causal_mask(2, 3)
    assert m.shape == (1, 1, 2, 5)
    assert m[0, 0].astype(int).tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]


def test_tree_mask_against_hand_built_reference():
    #      0
    #    /   \
    #   1     2
    #   |    / \
    #   3   4   5
    mask, depth = tree_mask([-1, 0, 0, 1, 2, 2], past_len=2)
    expected = np.array([
        [1, 1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 1, 0, 0],
        [1, 1, 1, 0, 1, 0, 1, 0],
        [1, 1, 1, 0, 1, 0, 0, 1],
    ], dtype=bool)
    assert np.array_equal(mask[0, 0], expected)
    assert depth.tolist() == [0, 1, 1, 2, 2, 2]
    chain_mask, chain_depth = tree_mask([-1, 0, 1], past_len=1)
    assert np.array_equal(chain_mask, causal_mask(3, 1))
    with pytest.raises(ValueError):
        tree_mask([-1, 2, 0], 0)
