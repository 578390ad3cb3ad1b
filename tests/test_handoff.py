"""The chunk hand-off between worker processes: tensors packed in one buffer, items intact."""

from __future__ import annotations

import pickle

import pytest
import torch

from conveyor.nodes._workers.chunk_packing import ALIGN, pack, unpack

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128,
          torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool]


def _round_trip(items):
    return unpack(pickle.loads(pickle.dumps(pack(items), protocol=pickle.HIGHEST_PROTOCOL)))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_and_layout_comes_back_equal(dtype):
    base = (torch.randn(3, 5) * 10).to(dtype)
    views = {"whole": base, "column": base[:, 1], "transposed": base.t(), "scalar": base[0, 0],
             "empty": base[:0], "odd": base[1, :3]}
    items = [{"name": name, "t": t, "n": i} for i, (name, t) in enumerate(views.items())]
    back = _round_trip(items)
    for sent, got in zip(items, back):
        assert (got["name"], got["n"]) == (sent["name"], sent["n"])
        assert got["t"].dtype == dtype and got["t"].shape == sent["t"].shape, sent["name"]
        assert torch.equal(got["t"], sent["t"]), sent["name"]
        if got["t"].numel():
            assert got["t"].data_ptr() % got["t"].element_size() == 0  # aligned for its dtype


def test_tensors_share_one_buffer_at_aligned_offsets_and_can_be_written():
    items = [{"ids": torch.arange(n)} for n in (1, 7, 100)]
    structure, metas, raw = pack(items)
    assert ALIGN == 64 and [m[2] for m in metas] == [0, 64, 128]  # 8, 56 and 800 bytes
    assert raw.raw().nbytes == 128 + 832
    back = _round_trip(items)
    back[1]["ids"].add_(1)  # a writable buffer: in-place ops work and touch only this tensor
    assert back[1]["ids"].tolist() == list(range(1, 8)) and back[2]["ids"].tolist() == list(range(100))


def test_one_tensor_twice_stays_one_and_other_kinds_go_the_ordinary_way():
    shared = torch.arange(5)
    param = torch.nn.Parameter(torch.ones(2))
    grad = torch.ones(2, requires_grad=True)
    sparse = torch.ones(3).to_sparse()
    back = _round_trip([shared, shared, param, grad, sparse, "text", 3, None])
    assert back[0] is back[1] and back[0].tolist() == [0, 1, 2, 3, 4]
    assert type(back[2]) is torch.nn.Parameter and back[3].requires_grad
    assert back[4].layout == torch.sparse_coo and back[4].to_dense().tolist() == [1, 1, 1]
    assert back[5:] == ["text", 3, None]


def test_the_buffer_travels_out_of_band_and_unpacks_unpickled_too():
    items = [{"ids": torch.arange(10)}, {"ids": torch.arange(3)}]
    oob: list = []
    body = pickle.dumps(pack(items), protocol=5, buffer_callback=oob.append)
    assert len(oob) == 1 and oob[0].raw().nbytes == 128 + 64  # 80 and 24 bytes, not in the pickle
    assert len(body) < 400
    back = unpack(pickle.loads(body, buffers=[bytearray(b.raw()) for b in oob]))
    assert [b["ids"].tolist() for b in back] == [list(range(10)), list(range(3))]
    direct = unpack(pack(items))  # same process, no pickling (as worker threads would)
    assert [b["ids"].tolist() for b in direct] == [list(range(10)), list(range(3))]


def test_a_chunk_without_tensors_has_an_empty_buffer():
    structure, metas, raw = pack([{"a": 1}, [2, 3]])
    assert metas == [] and raw.raw().nbytes == 0
    assert _round_trip([{"a": 1}, [2, 3]]) == [{"a": 1}, [2, 3]]


def test_big_tensors_go_through_shared_memory_when_asked():
    from conveyor.nodes._workers.chunk_packing import SHARE_MIN_BYTES

    big = torch.arange(SHARE_MIN_BYTES // 8, dtype=torch.int64)
    small = torch.arange(5)
    structure, metas, raw = pack([{"big": big, "small": small}], share=True)
    assert [m[1] for m in metas] == [(5,)]  # only the small one is packed by value
    back = unpack(pickle.loads(pickle.dumps((structure, metas, raw), protocol=5)))
    assert back[0]["big"].is_shared() and torch.equal(back[0]["big"], big)
    assert torch.equal(back[0]["small"], small)
    _, metas, _ = pack([{"big": big}])  # not asked: by value
    assert [m[1] for m in metas] == [tuple(big.shape)]


def test_when_shared_memory_fails_big_tensors_go_by_value_and_it_is_said_once(monkeypatch, caplog):
    import conveyor.nodes._workers.chunk_packing as handoff

    class NoRoom(handoff._Pickler):
        def dump(self, obj):
            raise RuntimeError("unable to write to file </torch_1_2>: No space left on device (28)")

    monkeypatch.setattr(handoff, "_sharing_pickler", lambda: NoRoom)
    big = torch.ones(handoff.SHARE_MIN_BYTES // 4)
    packer = handoff.Packer()
    with caplog.at_level("WARNING", logger="conveyor.nodes._workers.chunk_packing"):
        first = unpack(pickle.loads(pickle.dumps(packer([big]), protocol=5)))
        second = unpack(pickle.loads(pickle.dumps(packer([big * 2]), protocol=5)))
    assert torch.equal(first[0], big) and torch.equal(second[0], big * 2)  # by value: nothing lost
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "No space left on device" in warned[0] and "--shm-size" in warned[0]
    assert packer.share is False


def test_when_a_lent_slot_cannot_be_made_big_tensors_go_by_value(monkeypatch, caplog):
    import multiprocessing as mp

    import conveyor.nodes._workers.chunk_packing as handoff
    from conveyor.nodes._workers.shared_slots import Lender

    def no_room(self):
        raise RuntimeError("unable to write to file </torch_1_2>: No space left on device (28)")

    monkeypatch.setattr(torch.Tensor, "share_memory_", no_room)  # the slot's segment cannot be made
    big = torch.ones(handoff.SHARE_MIN_BYTES // 4)
    packer = handoff.Packer(lender=Lender(mp.get_context("spawn").Array("b", 4)))
    with caplog.at_level("WARNING", logger="conveyor.nodes._workers.chunk_packing"):
        back = unpack(pickle.loads(pickle.dumps(packer([big, big * 2]), protocol=5)))
    assert torch.equal(back[0], big) and torch.equal(back[1], big * 2)  # by value: nothing lost
    assert packer.share is False and "--shm-size" in caplog.records[0].getMessage()
