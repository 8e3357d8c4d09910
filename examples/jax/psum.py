"""A JAX job across processes: every worker joins one JAX runtime and adds up one number per
process with a psum over the global device mesh.

On a TPU VM, jax.distributed.initialize() needs no arguments: JAX reads the VM's metadata. On GPU
and CPU workers it needs the number of processes and this one's id, which podrun gives every worker
(PODRUN_NUM_WORKERS, PODRUN_WORKER); the coordinator's address it reads from JAX_COORDINATOR_ADDRESS,
which podrun sets too (worker 0's internal IP).
"""

import os

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

if os.environ.get("PJRT_DEVICE", "CPU") == "CPU":
    jax.config.update("jax_platforms", "cpu")
    jax.distributed.initialize(num_processes=int(os.environ["PODRUN_NUM_WORKERS"]),
                               process_id=int(os.environ["PODRUN_WORKER"]))
else:
    jax.distributed.initialize()

mesh = jax.make_mesh((jax.device_count(),), ("i",))
# each process contributes its index + 1 from each of its devices
mine = np.full((jax.local_device_count(),), jax.process_index() + 1.0, dtype=np.float32)
values = jax.make_array_from_process_local_data(NamedSharding(mesh, P("i")), mine)
total = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P()))(values)
print(f"process {jax.process_index()} of {jax.process_count()}, {jax.device_count()} devices: "
      f"psum {float(total.addressable_data(0).reshape(-1)[0]):g}", flush=True)
