"""An MPI program (mpi4py, Open MPI from Debian) for the two-hosts x two-processes job of
test_distributed_training.py: every rank prints its rank, the world size and the host it runs on,
the ranks allgather (rank, host, address) over MPI, and every rank writes
/opt/ml/model/mpi-rank-<R>.json on its own host (Kiln merges the hosts' model dirs)."""
import fcntl
import json
import os
import socket
import struct

from mpi4py import MPI


def eth_address(ifname):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", ifname[:15].encode()))
        except OSError:
            return None
        return socket.inet_ntoa(raw[20:24])


comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
# The host is the hostname (algo-N): mpirun exports the master's environment, SM_CURRENT_HOST
# included, to every rank (as SageMaker's toolkit does).
host = socket.gethostname()
me = {"rank": rank, "size": size, "host": host, "env_current_host": os.environ.get("SM_CURRENT_HOST"),
      "custom_option_env": os.environ.get("KILN_TEST_MPI"),
      "address": eth_address(os.environ.get("SM_NETWORK_INTERFACE_NAME", "eth0")), "pid": os.getpid()}
print("mpi rank=%d size=%d host=%s address=%s" % (rank, size, host, me["address"]), flush=True)
everyone = comm.allgather(me)
total = comm.allreduce(rank + 1, op=MPI.SUM)
me["gathered"] = everyone
me["sum"] = total
with open(os.path.join(os.environ.get("SM_MODEL_DIR", "/opt/ml/model"), "mpi-rank-%d.json" % rank), "w") as f:
    json.dump(me, f, indent=1)
if rank == 0:
    print("mpi world %s sum=%d" % (json.dumps(sorted((e["rank"], e["host"]) for e in everyone)), total), flush=True)
comm.Barrier()
