"""One tensor-parallel rank of the shared-stream test: reads data-parallel rank DP of WORLD
through dquant.torch with 2 DataLoader workers, as the shared stream SHARE of a group of
GROUP processes (or alone, with SHARE "-"), and prints the sha256 of every batch's
input_ids and labels, in the order the loop received them.

Usage: python tp_rank.py AGENT PLAN_JSON DP WORLD SHARE GROUP
"""

import hashlib
import json
import sys

from dquant.torch import DataLoader, TokenDataset

agent, plan, dp, world, share, group = sys.argv[1:7]
ds = TokenDataset(
    json.loads(plan),
    agent=agent,
    rank=int(dp),
    world_size=int(world),
    share=None if share == "-" else share,
    share_group=int(group),
)
h = hashlib.sha256()
batches = 0
for batch in DataLoader(ds, num_workers=2, prefetch_factor=2):
    h.update(batch["input_ids"].numpy().tobytes())
    h.update(batch["labels"].numpy().tobytes())
    batches += 1
print(batches, h.hexdigest())
