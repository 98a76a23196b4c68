"""LruIndex: least recently used first; a touched chain keeps its head longest."""

from hicache_galahad.store.eviction import LruIndex


def drain(index: LruIndex) -> list:
    order = []
    while (victim := index.pop_oldest()) is not None:
        order.append(victim[0])
    return order


def test_oldest_first_and_touch_moves_to_the_back():
    index = LruIndex()
    index.load([("a", 1), ("b", 2)])
    index.add("c", 3)
    index.touch("a")
    assert len(index) == 3
    assert drain(index) == ["b", "c", "a"]


def test_loaded_entries_go_behind_nothing_already_indexed():
    index = LruIndex()
    index.add("new", 1)
    index.load([("old", 1), ("new", 5)])
    assert drain(index) == ["old", "new"]


def test_chain_head_is_evicted_last():
    index = LruIndex()
    chain = [f"page{i}" for i in range(4)]
    for location in chain:
        index.add(location, 1)
    index.touch_many_head_last(chain)
    assert drain(index) == ["page3", "page2", "page1", "page0"]


def test_discard_returns_the_size_once():
    index = LruIndex()
    index.add("a", 7)
    assert index.discard("a") == 7
    assert index.discard("a") is None
    assert index.pop_oldest() is None


def test_sampled_lru_leaves_pinned_bytes_out_of_what_it_could_free():
    from hicache_galahad.store.eviction import SampledLru

    index = SampledLru(lambda want: [], lambda: 1000)
    assert index.total_bytes == 1000
    index.pinned_bytes = lambda: 300
    assert index.total_bytes == 700
    index.pinned_bytes = lambda: 5000  # more pinned than the ledger holds: nothing to free
    assert index.total_bytes == 0
