"""Capacity: what a job's workers run on, as something the job holds. base.Capacity is the one
interface (acquire, lost, reacquire, give back); each kind that holds something has its module: the
TPU's nodes and queued resources (tpu.py), Slurm's allocation (slurm.py). SSH hosts and local workers
are simply there: they keep base.Capacity's defaults. A target (targets/) is how the workers on that
capacity are reached; launch/holding.py is the job's life with its capacity (made, watched, made
again, given back), kept in the job's record."""
