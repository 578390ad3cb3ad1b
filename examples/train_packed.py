"""A training step on packed rows (specs/pretrain.yaml), on CPU, with torch's own attention.

Each batch holds rows of ``seq_len`` tokens packed from whole documents. Attention must not
cross a document boundary: the mask is block-diagonal (``segment_ids`` equal) and causal, given
to ``torch.nn.functional.scaled_dot_product_attention``; positions come from ``position_ids``,
which restart at 0 for each document. ``labels`` carry -100 on padding and on each document's
first token, so the shifted next-token loss never asks a document to predict the next one:
the loss of a packed batch is the loss of its documents run one by one (``one_by_one_loss``;
tests/test_train_packed.py checks it). With flash-attention on a GPU, ``cu_seqlens`` replaces
the mask: ``conveyor.text.varlen_cu_seqlens(batch["cu_seqlens"])`` is its varlen form.

    python examples/train_packed.py --steps 5 --seq-len 512
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from conveyor import load_graph

SPEC = Path(__file__).resolve().parent.parent / "specs" / "pretrain.yaml"
VOCAB = 258  # byte_tokenize: 256 bytes, bos 256, eos 257


class TinyLM(nn.Module):
    """Embeddings, one causal self-attention block, a head: just enough to have a loss."""

    def __init__(self, vocab: int = VOCAB, dim: int = 32, heads: int = 2, max_len: int = 4096):
        super().__init__()
        self.heads = heads
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, vocab]; ``mask`` [B, T, T] is True where a token may attend."""
        x = self.tok(ids) + self.pos(positions)
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.unsqueeze(1))
        x = x + self.out(y.transpose(1, 2).reshape(b, t, d))
        return self.head(x)


def block_causal_mask(segment_ids: torch.Tensor) -> torch.Tensor:
    """[B, T, T]: token i attends to j <= i of its own segment (padding, segment 0, to itself)."""
    same = segment_ids.unsqueeze(2) == segment_ids.unsqueeze(1)
    t = segment_ids.shape[1]
    return same & torch.ones(t, t, dtype=torch.bool).tril()


def packed_loss(model: nn.Module, batch: dict) -> tuple[torch.Tensor, int]:
    """Mean next-token loss over a packed batch, and the number of tokens it counts."""
    logits = model(batch["input_ids"].long(), batch["position_ids"], block_causal_mask(batch["segment_ids"]))
    labels = batch["labels"][:, 1:]
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
    return loss, int((labels != -100).sum())


def documents(batch: dict) -> list[torch.Tensor]:
    """The documents (pieces) of a packed batch, from each row's ``cu_seqlens``."""
    docs = []
    for row, cu, n in zip(batch["input_ids"], batch["cu_seqlens"], batch["num_docs"]):
        docs += [row[cu[k]:cu[k + 1]] for k in range(int(n))]
    return docs


def one_by_one_loss(model: nn.Module, docs: list[torch.Tensor]) -> torch.Tensor:
    """The same loss, each document run alone with a plain causal mask."""
    total, count = torch.zeros(()), 0
    for doc in docs:
        if len(doc) < 2:
            continue
        ids = doc.long().unsqueeze(0)
        positions = torch.arange(len(doc)).unsqueeze(0)
        mask = torch.ones(len(doc), len(doc), dtype=torch.bool).tril().unsqueeze(0)
        logits = model(ids, positions, mask)[0, :-1]
        total = total + F.cross_entropy(logits, ids[0, 1:], reduction="sum")
        count += len(doc) - 1
    return total / count


def main(argv: list[str] | None = None) -> float:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=4)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    model = TinyLM(max_len=args.seq_len)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loss = torch.zeros(())
    with load_graph(SPEC, seq_len=args.seq_len, batch_size=args.batch_size) as loader:
        for step, batch in enumerate(loader):
            if step >= args.steps:
                break
            loss, tokens = packed_loss(model, batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            print(f"step {step}: loss {loss.item():.4f} over {tokens} tokens, "
                  f"{int(batch['num_docs'].sum())} documents in {len(batch['input_ids'])} rows")
        waste = 1 - loader.stats()["nodes"]["pack"]["padding_efficiency"]
    print(f"padding: {100 * waste:.2f} % of the tokens so far")
    return float(loss)


if __name__ == "__main__":
    main()
