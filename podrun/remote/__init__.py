"""Code that runs on the workers. Never installed there: each module's source is sent over the
worker's channel when it is needed (transport.script_command, Transport.start_python), so every
module here uses the standard library only, runs on any Python >= 3.8, and does nothing when
imported (each runs its main() only as __main__). health_network.py alone imports a library: the job's own
torch, in the job's python3.

  agent.py                 one step of a job: start it, report, stop its whole tree (launch/steps.py)
  agent_io.py              the agent's stdin (the step, control lines) and stderr (events) (agent.py)
  step.py                  the user's command: start it, pump its output, stop its whole tree (agent.py)
  processes.py             the step's processes: spawn, exit, group and ancestry (step.py)
  hub.py                   a watched job's agents, connected, stopping each other (agent.py)
  tpu_holders.py           the processes holding a TPU VM's accelerator (agent.py's probe)
  relay_node.py            receive the shipped code, unpack it, pass it on (shipping/relay.py)
  rendezvous_listener.py   hold the rendezvous port on worker 0 (launch/preflight.py)
  rendezvous_connector.py  connect to it from every worker (launch/preflight.py)
  health_facts.py          a worker's versions, free disk and devices, read by the job's python3 (launch/health.py)
  health_network.py        preflight's all-reduce and link rates, in the job's python3 with torch (launch/health.py)
  log_follower.py          a detached job's output and exit (launch/detached.py)
  detached_stopper.py      stop a detached job's step (launch/detached.py)
  checkout.py              the run directory: check a code version out there, verify it first (agent.py)
  run_dirs.py              run/'s directories, never through a job's link, and the files placed in them (checkout.py)
  versions.py              a name's code versions: list them, prune old ones (checkout.py, disk.py)
  disk.py                  the disk podrun uses for a name, measured and freed (commands/disk.py)
  code_record.py           what each file of a code version held, so a job's write into it is found (checkout.py)
  rank_output.py           one torchrun rank, each of its lines marked with its rank (agent.py, plan.py)
  framing.py               the message framing both ends of the agent and relay protocols use
  slurm_fanout.py          Slurm's one step on the login node: one srun, every node's channel (transport/slurm_step.py)
  slurm_connector.py       its task on each node: connect back, run the agent, frame its streams (slurm_fanout.py)
  interfaces.py            the rendezvous doctor: a hostname that resolves to loopback (agent.py's probe)
  placement.py             put `podrun cp`'s files in place from their staging directory (commands/copy.py)
  stacks.py                the job's Python processes and their stacks (step.py, launch/stacks.py)
  vm_notice.py             a TPU VM's own preemption and maintenance notice (step.py)
  self_delete.py           a TPU VM deleting itself with its own service account's token (idle_watch.py)
  idle_watch.py            idle_delete: worker 0 deletes its TPU once no job ran on it that long (launch/idle_watch.py)
  warm_client.py           a command on a supervisor host, through its warm podrun (supervisor/warm.py)
"""
