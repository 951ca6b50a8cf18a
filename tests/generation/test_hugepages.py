"""attnkit.generation.hugepages: tensors on memory advised for 2 MiB pages."""

from __future__ import annotations

import gc
import mmap
import threading

import pytest
import torch

from attnkit.generation import hugepages

needs_huge_pages = pytest.mark.skipif(
    not hugepages.available(),
    reason="no transparent huge pages here (not Linux, or the kernel's setting is 'never'); "
    "test_falls_back_to_torch_empty covers the path taken instead",
)


def _resident_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * mmap.PAGESIZE / 2**20


def _region(address: int) -> tuple[int, int, list[str]] | None:
    """The mapping of this process that holds ``address``: (start, end, VmFlags), from
    /proc/self/smaps (VmFlags "hg": advised for huge pages)."""
    found = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                start, end = (int(n, 16) for n in head.split("-"))
                found = (start, end) if start <= address < end else None
            elif found is not None and head == "VmFlags:":
                return (*found, line.split()[1:])
    return None


@pytest.mark.parametrize(
    "shape, dtype",
    [((3, 5), torch.float32), ((768, 3072), torch.float32), ((7,), torch.bfloat16),
     ((2048, 4096), torch.float32), ((0, 4), torch.float32)],
)  # fmt: skip
def test_empty_gives_a_writable_contiguous_tensor(shape, dtype):
    t = hugepages.empty(shape, dtype)
    assert t.shape == shape and t.dtype == dtype and t.device.type == "cpu"
    assert t.is_contiguous()
    values = torch.arange(t.numel(), dtype=torch.float32).reshape(shape).to(dtype)
    t.copy_(values)
    assert torch.equal(t, values)


@needs_huge_pages
def test_tensors_lie_in_mappings_advised_for_huge_pages():
    """Large tensors start on a huge page of a mapping of their own; small ones share one, each
    on a cache line; every such mapping carries the kernel's "hg" flag (madvise was called)."""
    big = hugepages.empty((hugepages.ARENA // 4,), torch.float32)
    assert big.data_ptr() % hugepages.HUGE_PAGE == 0
    start, end, flags = _region(big.data_ptr())
    assert "hg" in flags and end >= big.data_ptr() + hugepages.ARENA
    small = [hugepages.empty((257, 3), torch.float32) for _ in range(5)]
    assert all(t.data_ptr() % hugepages.ALIGN == 0 for t in small)
    regions = {_region(t.data_ptr())[:2] for t in small}
    region = _region(small[0].data_ptr())
    assert len(regions) == 1 and "hg" in region[2]  # one shared, advised mapping
    # the control: a mapping made the same way but not advised lacks the flag. (Not torch's own
    # memory: malloc may advise its heap itself, e.g. with GLIBC_TUNABLES=glibc.malloc.hugetlb=1,
    # and so may any library loaded into the process.)
    plain = mmap.mmap(-1, hugepages.ARENA, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    control = torch.frombuffer(plain, dtype=torch.uint8, count=1)
    assert "hg" not in _region(control.data_ptr())[2]


@needs_huge_pages
def test_a_shared_mapping_is_unmapped_with_its_last_tensor(monkeypatch):
    monkeypatch.setattr(hugepages, "_ARENA", hugepages._Arena())  # starts with no mapping
    first = hugepages.empty((1000,), torch.float32)
    second = hugepages.empty((1000,), torch.float32)
    mapping = hugepages._ARENA._mapping()  # the arena holds it weakly
    assert mapping is not None and second.data_ptr() == first.data_ptr() + 4032  # 64-byte steps
    del first
    gc.collect()
    assert hugepages._ARENA._mapping() is mapping  # the second tensor keeps it
    del mapping, second
    gc.collect()
    assert hugepages._ARENA._mapping() is None  # unmapped with its last tensor
    third = hugepages.empty((1000,), torch.float32)  # a new mapping
    assert hugepages._ARENA._mapping() is not None
    third.fill_(1.0)


@needs_huge_pages
def test_small_tensors_share_a_mapping_without_overlapping():
    """Tensors cut from one mapping: each keeps its own values after the others are written."""
    tensors = [hugepages.empty((100 + i, 33), torch.float32) for i in range(40)]
    starts = sorted((t.data_ptr(), t.numel() * 4) for t in tensors)
    for (start, size), (following, _) in zip(starts, starts[1:], strict=False):
        assert start + size <= following
    for i, t in enumerate(tensors):
        t.fill_(i)
    for i, t in enumerate(tensors):
        assert bool((t == i).all())
    # more than one mapping's worth: the arena moves on to a new mapping
    many = [hugepages.empty((1 << 20,), torch.float32) for _ in range(20)]  # 4 MiB each
    for i, t in enumerate(many):
        t.fill_(i)
    assert all(bool((t == i).all()) for i, t in enumerate(many))


@needs_huge_pages
def test_a_view_keeps_the_memory_and_freeing_returns_it():
    before = _resident_mib()
    t = hugepages.empty((16, 1 << 20), torch.float32)  # 64 MiB
    t.fill_(3.0)
    assert _resident_mib() - before > 48
    view = t[10:12]
    del t
    gc.collect()
    assert bool((view == 3.0).all())  # the mapping lives while a view does
    del view
    gc.collect()
    assert _resident_mib() - before < 16


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")
def test_quantized_dtypes_take_torch_empty():
    t = hugepages.empty((4,), torch.quint8)  # torch cannot view such a tensor from a buffer
    assert t.shape == (4,) and t.dtype == torch.quint8


def test_falls_back_to_torch_empty(monkeypatch):
    monkeypatch.setattr(hugepages, "available", lambda: False)
    made = []
    real = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: made.append(a) or real(*a, **k))
    t = hugepages.empty((1024, 1024), torch.float32)
    assert made == [((1024, 1024),)] and t.shape == (1024, 1024) and t.is_contiguous()


def test_available_reads_the_kernel_setting(monkeypatch, tmp_path):
    hugepages.available.cache_clear()
    try:
        for setting, expected in (("always [madvise] never", True),
                                  ("[always] madvise never", True),
                                  ("always madvise [never]", False)):  # fmt: skip
            path = tmp_path / "enabled"
            path.write_text(setting + "\n")
            monkeypatch.setattr(hugepages, "_SETTING", str(path))
            hugepages.available.cache_clear()
            assert hugepages.available() is (expected and hasattr(mmap, "MADV_HUGEPAGE"))
        monkeypatch.setattr(hugepages, "_SETTING", str(tmp_path / "missing"))
        hugepages.available.cache_clear()
        assert hugepages.available() is False
    finally:
        monkeypatch.undo()
        hugepages.available.cache_clear()


@needs_huge_pages
def test_threads_cutting_from_the_arena_get_separate_memory():
    results: list[list[torch.Tensor]] = [[] for _ in range(4)]

    def work(slot: int) -> None:
        for _ in range(50):
            t = hugepages.empty((1000,), torch.float32)
            t.fill_(slot)
            results[slot].append(t)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for slot, tensors in enumerate(results):
        assert all(bool((t == slot).all()) for t in tensors)
    pointers = [t.data_ptr() for tensors in results for t in tensors]
    assert len(set(pointers)) == len(pointers)
