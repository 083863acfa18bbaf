"""A 2-level launcher and an all-reduce with jax.distributed on CPU, driven only by gpufed's rendezvous.

Run as a pod's command (`python jax_allreduce.py`): like torchrun, it starts NPROC_PER_NODE worker
processes, worker i with global rank RANK + i, and every worker joins the gang's coordinator at
MASTER_ADDR:MASTER_PORT with WORLD_SIZE processes. Each contributes its rank + 1 to an all-reduce
(gloo), so every rank must see WORLD_SIZE * (WORLD_SIZE + 1) / 2; a worker that does not exits 1.
The launcher pod (NODE_RANK 0) also prints the hostfile gpufed mounted for MPI and DeepSpeed.
Needs `jax` (with jaxlib) in the interpreter that runs it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def worker(local_rank: int) -> int:
    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    rank = int(os.environ["RANK"]) + local_rank
    world = int(os.environ["WORLD_SIZE"])
    coordinator = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=world, process_id=rank)
    # Every process's value, gathered over gloo and summed: the all-reduce of a data-parallel step.
    total = int(multihost_utils.process_allgather(jnp.array([rank + 1])).sum())
    expected = world * (world + 1) // 2
    print(
        f"allreduce rank={rank} world={world} node_rank={os.environ['NODE_RANK']} "
        f"host={socket.gethostname()} sum={total} expected={expected}",
        flush=True,
    )
    jax.distributed.shutdown()
    return 0 if total == expected else 1


def launcher() -> int:
    nproc = int(os.environ["NPROC_PER_NODE"])
    if os.environ.get("NODE_RANK") == "0" and os.environ.get("GPUFED_HOSTFILE"):
        with open(os.environ["GPUFED_HOSTFILE"]) as hostfile:
            for line in hostfile:
                print(f"hostfile: {line.rstrip()}", flush=True)
    children = [subprocess.Popen([sys.executable, __file__, "--local-rank", str(i)]) for i in range(nproc)]
    codes = [child.wait() for child in children]
    return max(codes, default=0)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--local-rank"]:
        sys.exit(worker(int(sys.argv[2])))
    sys.exit(launcher())
