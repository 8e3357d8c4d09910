"""podrun's worker-side agent: runs one step of a job on this worker and stays with it to the end.

It starts from the worker's cache by the hash of its source, which is sent over the channel's stdin
only where the worker lacks it (transport/base.py, BOOTSTRAP); never installed, so it uses the
standard library only and runs on the worker's own python3 (3.8 or newer). It starts on every worker
for every step, so it imports only built-in modules: json, subprocess, shutil and selectors would
double its start-up (they pull in re, collections and more), and even `signal`
costs 4.5 ms of a 7 ms Python start (it builds enums), so the agent uses its C core, `_signal`.

This module is its entry and protocol; its parts travel with it, compiled into its cache entry
(transport/base.py, script_modules): agent_io.py (stdin and stderr), step.py (the user's command),
processes.py (the step's processes), hub.py (a watched job), tpu_holders.py and checkout.py (the
probe, the run directory).

Protocol
  stdin   the step: a decimal byte count, a newline, then that many bytes of marshal format 4 (readable
          by every Python 3.4+) holding {job_id, job_dir (where its files go, relative to the root: one
          per attempt of a restarted job), worker, step, cwd (the run directory), code_dir (the
          code version checked out into cwd before the step starts: checkout.py), command, env,
          grace, heartbeat, detach, job_files (name: text, written into the job's directory first: the
          workers' IPs, and for run under torchrun rank_output.py), file_env (variable: the name of a
          job file, set to its path)}, for run {container, term ("leader" or "group"), progress (the spec's:
          {pattern} or {file}, or null; step_reader.py)}, for a job's
          first step "probe", for a watched run "watch", for a run on a TPU VM "vm_notices" (true: the
          VM's own notice of its preemption stops the job at once, within step.NOTICE_BOUND_S, vm_notice.py)
          and "on_preempt" (the spec's command, started on that notice, or null); then control lines: "stop" asks for a
          graceful stop; any line is a heartbeat. End of input, or no line for `heartbeat` seconds (a
          link that died silently), means the launcher is gone: the job stops too.
  probe   (reported first: {"event": "hello"}, before any of its checks, which may wait for a lock)
          {code_dir, and on a TPU VM accelerator_files (glob patterns, colon-separated), kill_stale,
          stale_grace, and on several hosts route_to (MASTER_ADDR)}: before starting anything the
          agent reports {"event": "probe", "code": 1 if code_dir is here as shipped else 0
          (checkout.verify), "changed" (newline-separated) and "changed_count": the first few and the count
          of the files a job changed in this worker's copy (removed: it is shipped again), "holders": "pid TAB
          file TAB command" lines (tpu_holders.encoded) of the processes that hold the TPU (killed first with kill_stale),
          and with route_to hostname, resolves_to, interface, interface_set (interfaces.py: the
          variables it set in the step's env)}, then waits for the line "go" (the launcher
          ships the code and checks every worker meanwhile); "stop" or end of input instead: it exits.
          So one channel per worker does what would otherwise take three.
  watch   {token, worker, hub_worker, workers, bind, stall, alive_every, progress, auto, away_s, delete}: a detached
          run (on several workers, with a stall limit, or kept by a supervisor host), whose agents stop each
          other's steps when one fails, with no launcher left (hub.py). The hub_worker's agent listens on
          `bind` (its internal address) and reports {"event": "hub", "port": P} first; every agent waits for
          "go HOST:PORT" (the hub's address) before it starts.
          With stall (seconds, or "auto" with auto's {multiple, floor_s, cap_s}), the hub also stops the job
          when no worker printed anything (with progress: reached a step) for that long: each agent first
          saves its job's stacks as run.stacks (stacks.py). With away_s, the hub stops the job once the
          supervisor host that keeps it has not followed it for that long (its supervisor.beat: hub.py), and
          with delete ({api, names}: self_delete.py) worker 0's agent then deletes the job's TPU with the VM's
          own credentials, writing what came of it to self_delete.txt after run.exit.
  notify  {url, on, name, attempt}, to worker 0's agent of a detached run that nothing watches: once every
          agent is done (the hub says), it tells the job's end (failure, preemption, stall, success) as
          a notification (notice.py) and writes what came of it to notify.json, then run.exit.
  stdout  the command's output, stdout and stderr merged, byte for byte.
  stderr  JSON event lines: {"event": "started", "pid": P}, {"event": "exited", "code": C, "stop_reason": R,
          "signal": NAME or null, "rank": R or null (torchrun: the rank whose code C is), "killed": true
          when a stop's SIGKILL ended it after the grace period},
          {"event": "error", "message": M}, {"event": "notice", "reason": R} (the VM announced it goes away),
          {"event": "step", "step": S, "at": EPOCH_SECONDS} (with progress: a step reached, at most once a second;
          with an epoch group also "epoch", "epoch_step", "first_epoch", "epoch_steps": step_reader.py; the first
          also "first": the step of the run's first line that had one),
          {"event": "fell", "step": S, "before": TEXT, "after": TEXT} (the step first fell, from S: once).
Files, under job_dir, ~/.podrun/jobs/<job_id>[.attempt-K]/ (mode 0700), so that output survives the launcher:
  output.log (every byte of every step), <step>.pid (the step's process group and session), <step>.agent (the
  agent's pid and kernel start time, "PID START": SIGTERM to it stops the step cleanly), <step>.py-spy (the
  py-spy on the step's PATH as it started, or nothing: what its stacks are dumped with), <step>.container
  (a docker: job's container name, whose processes its stacks include), notify.json (notify), <step>.exit
  (JSON: code, signal, stop_reason, ended_at, rank, cause_worker/cause_code when another worker's failure stopped this one,
  stalled: how long this worker had been silent when a stall stopped it, stalled_at: when (epoch seconds),
  killed: whether SIGKILL ended it after the grace period, and with progress step: its step or null,
  fell_from/fell_to: where its step fell from and to while it has not passed that since, else null, and
  with an epoch group the step event's epoch fields),
  run.stacks (on a stall),
  run.step (a detached run with progress: "STEP EPOCH_SECONDS", its latest) and run.steps (its steps over
  time, "T S T S ...", bounded: step_reader.add_sample; every 10 s and at the end); each file 0600.
With "detach": true the agent reports {"event": "detached", "pid": P} and carries on in a session
of its own, without stdin or stdout, until the step ends or it receives SIGTERM.

Stopping sends SIGTERM, once per process, to the step's process group (to its leader alone with
"term": "leader": torchrun passes it on to its ranks) and to every other process of the step: on Linux
the agent is a child subreaper (it imports _ctypes for that, 0.5 ms: processes.become_subreaper), so
whatever the step started stays below it, setsid'd and orphaned processes included, and it walks that
tree through /proc/PID/task/TID/children; elsewhere, every process that still carries this job's
PODRUN_JOB_ID and PODRUN_WORKER in its environment and is this user's, read from all of /proc. SIGKILL
follows after the grace period. A container is stopped by name
(docker stop -t GRACE, then docker kill), and the step ends only once it is gone. The same sweep
runs after a normal exit, so nothing the step started outlives it.
"""

import os
import sys

try:  # on a worker, each was sent ahead of this file (transport/base.py, script_modules)
    agent_io, checkout, framing, hub, interfaces, notice, processes, step, tpu_holders, vm_notice = (
        sys.modules["podrun_remote_" + name]
        for name in ("agent_io", "checkout", "framing", "hub", "interfaces", "notice", "processes", "step",
                     "tpu_holders", "vm_notice"))
except KeyError:  # imported on the launcher, by tests and type checks
    from podrun.remote import agent_io, checkout, framing, hub, interfaces, notice, processes, step, tpu_holders, vm_notice

CHANGED_NAMED = 3  # of the code files a job changed, those the probe names
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")  # a step's stop_reason when podrun stop (or a user) signalled it


def main():
    control = agent_io.ControlInput()
    config = framing.read_message(control)
    job_dir = os.path.abspath(config["job_dir"])  # .podrun/jobs/<job_id>, one per attempt (paths.remote_job_dir)
    jobs_dir = os.path.abspath(os.path.join(".podrun", "jobs"))
    # each private, not just the last; in a shared home, .podrun/jobs/<job_id>/w<i>: the job's own directory first
    job_parent = [] if os.path.dirname(job_dir) == jobs_dir else [os.path.dirname(job_dir)]
    for directory in [".podrun", jobs_dir] + job_parent + [job_dir]:
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass
    job_step = step.Step(config, job_dir)
    watch = prepare(config, control, job_step)
    report = detach() if config.get("detach") else None
    try:
        job_step.start()
    except OSError as error:
        agent_io.emit(event="error", message="cannot start %r in %s: %s" % (config["command"], config["cwd"], error))
        os._exit(processes.SPAWN_FAILED)
    agent_io.emit(event="started", pid=job_step.pid)
    if report is not None:
        os.write(report, b"started")
        os.dup2(os.open(os.devnull, os.O_RDWR), 2)  # closes the last copy of the report pipe
        os.close(report)
        control = None
    code, signal_name = job_step.supervise(control, watch)
    telling = config.get("notify")
    if telling is None:
        job_step.write_exit()
    agent_io.emit(event="exited", code=code, signal=signal_name, rank=job_step.rank, killed=job_step.killed,
                  stop_reason=job_step.stop_reason)
    if watch is not None:
        watch.step_ended(code, end_word(job_step))
        watch.serve(job_step)
    if telling is not None:  # its exit last: whoever sees the job's end sees what was told of it
        job_step.write_exit(tell_end(telling, config, job_step, watch, code))
    if watch is not None and (deleted := watch.delete_if_away()):
        job_step.write_file("self_delete.txt", deleted + "\n")
    # everything went out through os.write: skipping the interpreter's teardown saves ~1 ms of CPU
    # on every worker for every step
    os._exit(code)


def prepare(config, control, job_step):
    """Everything before the step starts: the probe and the launcher's "go", the checkout into the
    run directory, and a watched job's line between agents (returns its Hub or HubLink, else None)."""
    watch_config = config.get("watch")
    hub_here = None
    if watch_config and watch_config["worker"] == watch_config["hub_worker"]:
        try:
            hub_here = hub.Hub(watch_config, job_step.job_dir)
        except OSError as error:  # the internal address is not one of this host's own (NAT)
            agent_io.emit(event="error", message="cannot listen on %s, this worker's internal address, for the "
                          "other workers' agents to watch the job: %s" % (watch_config["bind"], error.strerror or error))
            os._exit(processes.SPAWN_FAILED)
    if hub_here is not None:
        agent_io.emit(event="hub", port=hub_here.port)
    probe = config.get("probe")
    if probe is not None:
        agent_io.emit(event="hello")  # the launcher's first contact: the worker's login let a command through
        holders = tpu_holders.find(probe) if probe.get("accelerator_files") else []
        network = interfaces.check(probe["route_to"], config["env"]) if probe.get("route_to") else {}
        try:
            present, changed = checkout.verify(probe["code_dir"]) if probe["code_dir"] else (False, [])
        except checkout.CheckoutError as error:
            agent_io.emit(event="error", message=str(error))
            os._exit(1)
        agent_io.emit(event="probe", code=int(present), changed="\n".join(changed[:CHANGED_NAMED]),
                      changed_count=len(changed), holders=tpu_holders.encoded(holders), **network)
    hub_address = ""
    if probe is not None or watch_config:
        hub_address = control.wait_for_go(job_step.heartbeat)
        if hub_address is None:
            os._exit(0)  # the launcher decided not to start the job, or is gone
    if config.get("code_dir"):  # the code is in place now: the job runs in its run directory
        try:
            checkout.check_out(config["code_dir"], config["cwd"], config["job_id"])
        except checkout.CheckoutError as error:
            agent_io.emit(event="error", message=str(error))
            os._exit(1)
    if not watch_config or hub_here is not None:
        return hub_here
    try:
        return hub.HubLink(hub_address, watch_config)
    except (OSError, ValueError) as error:  # ValueError: no address (that agent ended first)
        agent_io.emit(event="error", message="cannot reach worker %d's agent at %s to watch the job: %s"
                      % (watch_config["hub_worker"], hub_address, error))
        os._exit(processes.SPAWN_FAILED)


def end_word(job_step):
    """How the step ended when not by itself, in a word for the hub: stopped (podrun stop), preempted (its
    VM's notice), else ""."""
    if job_step.stop_reason in STOP_SIGNALS:
        return "stopped"
    return "preempted" if vm_notice.announced(job_step.stop_reason) else ""


def tell_end(telling, config, job_step, watch, code):
    """Worker 0's agent of a detached job that nothing watches, once every agent is done: the job's end
    told as the spec's notify asks (notice.py); returns what came of it, for notify.json, which the
    launcher reads with the job's end (log_follower.py), or None if nothing was told."""
    ended = job_end(config["worker"], job_step, watch, code)
    if ended is None or ended[0] not in telling["on"]:
        return None
    event, state, reason = ended
    if watch is not None and watch.advances:  # the job's step: the highest any worker reached (progress)
        reached = watch.advances[-1][1]
    else:
        reached = job_step.steps.step if job_step.steps is not None else None
    body = notice.message(config["job_id"], telling["name"], state, event, telling["attempt"], reached, reason)
    outcome = notice.deliver_within(telling["url"], body, notice.BOUND_S + 2)
    return agent_io.to_json(notice.entry(body, outcome, telling["url"], "worker %d" % config["worker"]))


def job_end(worker, job_step, watch, code):
    """(event, state, reason) of a detached job as its worker 0 (`worker`) sees it once every agent is done;
    None for a job podrun stop stopped. The hub's first failure decides, as the launcher's fetch would."""
    failure = watch.failure if watch is not None else ((worker, code) if code else None)
    words = watch.words if watch is not None else {worker: end_word(job_step)}
    word = words.get(failure[0]) if failure else words.get(worker)
    if word == "stopped" or end_word(job_step) == "stopped":
        return None
    if word == "preempted":
        return "preemption", "preempted", "worker %d: the VM announced it goes away" % (failure or (worker,))[0]
    if watch is not None and watch.stalled:
        return "stall", "stalled", "no %s from any worker for %gs" % (
            "output" if job_step.steps is None else "step", round(watch.bound(), 1))
    if failure:
        lost = failure[1] == hub.LOST and failure[0] != worker
        return "failure", "failed", ("worker %d was lost (its agent, its host or the link to it)" % failure[0] if lost
                                     else "worker %d exited with code %d" % failure)
    if watch is not None and len(watch.ended) < watch.workers:
        return "failure", "failed", "%d of %d workers never reached worker %d's agent" % (
            watch.workers - len(watch.ended), watch.workers, worker)
    return "success", "succeeded", notice.ALL_DONE


def detach():
    """Go on in a session of our own, away from the launcher's channel; returns the descriptor on
    which to tell the waiting original process that the step started. That process relays it as
    {"event": "detached"} (or the step's start error, which the detached agent emits to it) and exits."""
    read_end, write_end = os.pipe()
    if os.fork():
        os.close(write_end)
        relayed = b""
        chunk = os.read(read_end, 65536)
        while chunk:
            relayed += chunk
            chunk = os.read(read_end, 65536)
        pid, _, rest = relayed.partition(b"\n")
        if rest.endswith(b"started"):
            agent_io.emit(event="detached", pid=int(pid))
            os._exit(0)
        agent_io.write_all(2, rest)  # the detached agent's error event
        os._exit(processes.SPAWN_FAILED)
    os.close(read_end)
    os.setsid()
    if os.fork():
        os._exit(0)  # the grandchild can never get the launcher's terminal back
    os.write(write_end, b"%d\n" % os.getpid())
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(null, fd)
    os.dup2(write_end, 2)  # until the step starts, events (an error) go to the waiting parent
    return write_end


if __name__ == "__main__":
    main()
