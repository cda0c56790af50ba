"""The `pytorchddp` job of test_distributed_training.py (distribution={"pytorchddp": ...}: SageMaker
launches it with mpirun from algo-1, one process per host on CPU, without smddprun when the
environment has none). The script finds its place from Open MPI's variables, as scripts for this
launcher do without SMDDP, joins a gloo process group at MASTER_ADDR:MASTER_PORT (the toolkit's
algo-1:7777), all-reduces its rank + 1 and writes /opt/ml/model/pddp-rank-<R>.json on its host."""
import json
import os
import socket

import torch
import torch.distributed as dist

rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
dist.init_process_group("gloo", init_method="tcp://%s:%s" % (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]),
                        rank=rank, world_size=world)
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
me = {"rank": rank, "world": world, "host": socket.gethostname(), "sum": t.item(),
      "master": "%s:%s" % (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]),
      "smdataparallel": {k: v for k, v in os.environ.items() if k.startswith("SMDATAPARALLEL_")}}
print("pytorchddp rank=%d world=%d host=%s sum=%g" % (rank, world, me["host"], me["sum"]), flush=True)
with open(os.path.join(os.environ.get("SM_MODEL_DIR", "/opt/ml/model"), "pddp-rank-%d.json" % rank), "w") as f:
    json.dump(me, f)
dist.barrier()
dist.destroy_process_group()
