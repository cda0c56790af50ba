"""Two-host DistributedDataParallel on CPU (gloo), launched by torchrun through the SDK's
distribution={"torch_distributed": {"enabled": True}} (test_distributed_training.py).

Every rank trains the same Linear model on data of its own (so the ranks' local gradients
differ), STEPS steps of SGD. At each step it also computes the gradient of its own data alone on a
plain copy of the model, so the test can check that DDP's gradient is the mean of the ranks' local
ones. Each host writes /opt/ml/model/<host>.json (rank, world size, address, the local and the
DDP gradient of every step, the final weights and their SHA-256); Kiln merges both hosts' files
into one model.tar.gz."""
import copy
import fcntl
import hashlib
import json
import os
import socket
import struct

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

STEPS = 3


def eth_address(ifname):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", ifname[:15].encode()))
        except OSError:
            return None
        return socket.inet_ntoa(raw[20:24])


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    host = os.environ["SM_CURRENT_HOST"]
    iface = os.environ.get("SM_NETWORK_INTERFACE_NAME", "eth0")
    addr = eth_address(iface)
    print("ddp rank=%d world=%d host=%s hostname=%s %s=%s master=%s:%s" % (
        rank, world, host, socket.gethostname(), iface, addr, os.environ.get("MASTER_ADDR"),
        os.environ.get("MASTER_PORT")), flush=True)

    torch.manual_seed(1234)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    model = torch.nn.Linear(4, 1)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    steps = []
    for step in range(STEPS):
        x = torch.randn(16, 4, generator=gen)
        y = x.sum(dim=1, keepdim=True) * (rank + 1)
        plain = copy.deepcopy(model)
        torch.nn.functional.mse_loss(plain(x), y).backward()
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        steps.append({"loss": loss.item(),
                      "local_grad": [plain.weight.grad.flatten().tolist(), plain.bias.grad.tolist()],
                      "ddp_grad": [model.weight.grad.flatten().tolist(), model.bias.grad.tolist()]})
        opt.step()
        print("ddp rank=%d step=%d loss=%.6f" % (rank, step, loss.item()), flush=True)
    weights = [model.weight.detach().flatten().tolist(), model.bias.detach().tolist()]
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    with open(os.path.join(os.environ.get("SM_MODEL_DIR", "/opt/ml/model"), "%s.json" % host), "w") as f:
        json.dump({"rank": rank, "world": world, "host": host, "address": addr, "steps": steps,
                   "weights": weights, "sha256": digest}, f, indent=1)
    print("ddp rank=%d done weights_sha256=%s" % (rank, digest), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
