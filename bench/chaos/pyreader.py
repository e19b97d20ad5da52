#!/usr/bin/env python3
"""The chaos soak's Python reader: a `dquant.torch.TokenDataset` under a `DataLoader` with
workers, as a training job reads, checkpointing after every batch and resuming from its
checkpoint after any failure.

Each batch's samples (`input_ids` and the last label: the plan's `seq_len + 1` tokens, in
its output dtype) are appended to --out; then the dataset's `state_dict` and the bytes it
covers are saved to --state, atomically. A start with a saved state cuts --out back to those
bytes (a batch written after the last save is dropped and comes again) and loads the state,
so the file holds each batch of the loader's stream exactly once, in order, whatever killed
the run. Exit 0 at the end of the plan. Without --agent the plan runs in this process: the
soak's reference.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from dquant.torch import DataLoader, TokenDataset


def save(path: Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan", type=Path, required=True)
    ap.add_argument("--agent", help="the agent's address; none: in this process")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--state", type=Path, required=True)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    ds = TokenDataset(str(a.plan), agent=a.agent, dtype="raw")
    written = 0
    if a.state.exists():
        saved = json.loads(a.state.read_text())
        written = saved["bytes"]
        ds.load_state_dict(saved["state"])
    with open(a.out, "ab") as out:
        out.truncate(written)
        loader = DataLoader(ds, num_workers=a.workers)
        for batch in loader:
            rows = torch.cat([batch["input_ids"], batch["labels"][:, -1:]], dim=1)
            data = rows.contiguous().numpy().tobytes()
            out.write(data)
            out.flush()
            written += len(data)
            save(a.state, {"bytes": written, "state": ds.state_dict()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
