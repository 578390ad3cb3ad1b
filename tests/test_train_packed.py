"""examples/train_packed.py: a packed batch's loss, with a block-diagonal mask from segment_ids
and position_ids, is the loss of its documents run one by one; the script trains."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from conveyor import load_graph

ROOT = Path(__file__).resolve().parent.parent


def _example():
    spec = importlib.util.spec_from_file_location("train_packed", ROOT / "examples/train_packed.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_packed_batch_has_the_loss_of_its_documents_one_by_one():
    ex = _example()
    torch.manual_seed(1)
    model = ex.TinyLM(max_len=128)
    with torch.no_grad():
        model.qkv.weight.mul_(8)  # sharp attention: what a token attends to shows in the loss
    with load_graph(ex.SPEC, seq_len=128, batch_size=4) as loader:
        batch = next(b for b in loader if (b["num_docs"] > 2).sum() >= 2)  # rows of several documents
    with torch.no_grad():
        packed, tokens = ex.packed_loss(model, batch)
        alone = ex.one_by_one_loss(model, ex.documents(batch))
    assert tokens == sum(len(d) - 1 for d in ex.documents(batch))
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)
    # attending across the boundary (a plain causal mask) gives another loss: the mask matters
    with torch.no_grad():
        plain = batch | {"segment_ids": torch.ones_like(batch["segment_ids"])}
        leaked, _ = ex.packed_loss(model, plain)
    assert abs(float(leaked) - float(alone)) > 1e-3


def test_varlen_cu_seqlens_is_the_concatenated_form_of_the_segments():
    from conveyor.text import varlen_cu_seqlens

    ex = _example()
    with load_graph(ex.SPEC, seq_len=128, batch_size=4) as loader:
        batch = next(iter(loader))
    flat, longest = varlen_cu_seqlens(batch["cu_seqlens"])
    seg = batch["segment_ids"]
    # a segment starts where the segment id changes, and at each row's start
    starts = torch.ones_like(seg, dtype=torch.bool)
    starts[:, 1:] = seg[:, 1:] != seg[:, :-1]
    assert flat.dtype == torch.int32
    assert flat[:-1].tolist() == torch.nonzero(starts.reshape(-1)).reshape(-1).tolist()
    assert int(flat[-1]) == seg.numel() and longest == int((flat[1:] - flat[:-1]).max())


@pytest.mark.timeout(240)
def test_the_script_trains_a_few_steps(forker):
    out = forker.run([sys.executable, str(ROOT / "examples/train_packed.py"), "--steps", "3", "--seq-len", "128"],
                     timeout=200)  # a process of its own, forked from one that imported torch already
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("step ") == 3 and "padding:" in out.stdout, out.stdout
