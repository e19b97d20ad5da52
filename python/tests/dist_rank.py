"""One rank of the 2-rank test: joins a gloo process group through a file store, reads its
share of the plan through dquant.torch with 3 DataLoader workers, and saves every sample it
received (input_ids plus the last label) to OUT.npy.

Usage: python dist_rank.py RANK WORLD STORE_FILE PLAN_JSON OUT
"""

import json
import sys

import numpy as np
import torch
import torch.distributed as dist

from dquant.torch import DataLoader, TokenDataset

rank, world, store, plan, out = sys.argv[1:6]
dist.init_process_group("gloo", init_method=f"file://{store}", rank=int(rank), world_size=int(world))
ds = TokenDataset(json.loads(plan))
assert (ds.rank, ds.world_size) == (int(rank), int(world)), (ds.rank, ds.world_size)
rows = []
for batch in DataLoader(ds, num_workers=3, prefetch_factor=2):
    ids, labels = batch["input_ids"], batch["labels"]
    rows.append(torch.cat([ids, labels[:, -1:]], dim=1).numpy())
np.save(out, np.concatenate(rows))
dist.destroy_process_group()
