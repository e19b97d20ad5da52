"""A tiny language model trained on CPU from a dquant plan: the DataLoader wiring, a
checkpoint of the data position, and an exact resume.

    python examples/train_tiny.py --data testkit/fixtures/megatron/r50k_int32
    python examples/train_tiny.py --data corpus/r50k_int32 --agent /run/dquant.sock   # offloaded

Needs the dquant package (python/test.sh builds it into a venv; or `maturin develop` in
python/) and torch. The plan runs in this process unless --agent names a dquant agent
(`dquant serve --root corpus=DIR --socket /run/dquant.sock`); then --data is the dataset's
name on it (ROOT/PATH) and batches arrive over the agent's shared-memory ring or TCP.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
import torch.nn as nn

from dquant.torch import DataLoader, TokenDataset

VOCAB = 50_304  # r50k ids (< 50,257), padded to a multiple of 64


class TinyLM(nn.Module):
    """Embedding -> one causal self-attention block -> vocabulary logits."""

    def __init__(self, vocab: int = VOCAB, dim: int = 64, seq_len: int = 128) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq_len, dim))
        self.block = nn.TransformerEncoderLayer(
            dim, nhead=4, dim_feedforward=4 * dim, dropout=0.0, batch_first=True
        )
        self.head = nn.Linear(dim, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq_len))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        n = ids.shape[1]
        x = self.embed(ids) + self.pos[:n]
        return self.head(self.block(x, src_mask=self.mask[:n, :n], is_causal=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=os.path.join(os.path.dirname(__file__), "../testkit/fixtures/megatron/r50k_int32"),
                    help="Megatron prefix (a local path, or ROOT/PATH on --agent)")
    ap.add_argument("--agent", help="a dquant agent: dquant://HOST:PORT or its Unix socket path")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()

    plan = {
        "sources": [{"uri": args.data}],
        "seq_len": args.seq_len,
        "batch_size": args.batch_size,
        "seed": 1234,
        "epochs": 100,     # long enough for any --steps; the plan says exactly how long
        "output": "u16",   # r50k ids fit 16 bits: half the bytes of int32 through the loader
    }
    torch.manual_seed(0)
    model = TinyLM(seq_len=args.seq_len)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ckpt = os.path.join(tempfile.mkdtemp(), "ckpt.pt")

    def train(ds: TokenDataset, first: int, last: int, save_at: int | None = None) -> list[float]:
        # The dataset yields whole batches; DataLoader workers each run a share of the plan,
        # and dquant's DataLoader keeps ds.state_dict() exact while they prefetch.
        loader = DataLoader(ds, num_workers=args.workers, persistent_workers=False)
        t0, tokens, losses = time.perf_counter(), 0, []
        for step, batch in enumerate(loader, start=first):
            logits = model(batch["input_ids"])
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            tokens += batch["input_ids"].numel()
            losses.append(loss.item())
            if step % 10 == 0:
                print(f"step {step:4d}  loss {loss.item():.3f}  {tokens / (time.perf_counter() - t0):,.0f} tokens/s")
            if step + 1 == save_at:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "data": ds.state_dict()}, ckpt)
                print(f"step {step:4d}  checkpoint: data at {ds.state_dict()['cursors']}")
            if step + 1 == last:
                break
        return losses

    kw = {"agent": args.agent} if args.agent else {}
    half = args.steps // 2
    losses = train(TokenDataset(plan, **kw), 0, args.steps, save_at=half)

    # Resume from the mid-run checkpoint, as after a crash: the data continues exactly after
    # the last batch the loop had received, whatever the workers had prefetched.
    state = torch.load(ckpt)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    ds = TokenDataset(plan, **kw)
    ds.load_state_dict(state["data"])
    print(f"resumed from the checkpoint at step {half}")
    again = train(ds, half, args.steps)
    # Same data, same weights: the resumed steps repeat the first run's losses.
    same = all(abs(a - b) < 1e-4 for a, b in zip(again, losses[half:]))
    print(f"resumed losses {'match' if same else 'DIFFER from'} the uninterrupted run's")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
