"""The classes of a failure's cause (launch/causes.py) from the lines real frameworks print, and the cause
told apart from its cascade."""

from __future__ import annotations

import pytest

from podrun.launch.causes import classify, first_cause, line
from podrun.launch.steps import StepResult


@pytest.mark.parametrize("tail, code, signal, klass", [
    (["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB"], 1, None, "oom"),
    (["jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Error allocating device buffer"], 1, None, "oom"),
    (["Killed"], 137, "SIGKILL", "oom"),
    (["torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error"],
     1, None, "collective"),
    (["RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.3]:4"],
     1, None, "collective"),
    (["NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."], 1, None, "hardware"),
    (["RuntimeError: TPU initialization failed: open(/dev/accel0): Device or resource busy"], 1, None, "hardware"),
    (["ModuleNotFoundError: No module named 'transformers'"], 1, None, "config"),
    (["train.py: error: unrecognized arguments: --lr 3"], 2, None, "config"),
    (["sh: 1: trian.py: not found"], 127, None, "config"),
    (["ValueError: loss is nan at step 40"], 1, None, "exception"),
    ([], 139, "SIGSEGV", "signal"),
    (["bye"], 3, None, "unknown"),
])
def test_each_class_from_what_the_worker_printed(tail, code, signal, klass):
    assert classify(StepResult(0, code, signal, tail=tail)).klass == klass


def test_a_collective_failure_that_came_first_is_the_cascade_of_the_oom_that_caused_it():
    peer = ["RuntimeError: Connection closed by peer"]
    results = [StepResult(0, 1, tail=peer), StepResult(2, 1, tail=["MemoryError"]), StepResult(1, 1, tail=peer)]
    cause, cascade = first_cause(results)
    assert (cause.worker, cause.klass) == (2, "oom")
    assert line(cause, cascade, [], 5) == ("worker 2 failed first: out of memory (MemoryError) at step 5; workers 0-1 "
                                           "then failed in the collective")


def test_a_failure_of_collectives_alone_names_the_first_of_them():
    cause, cascade = first_cause([StepResult(1, 1, tail=["NCCL watchdog timeout"]), StepResult(0, 1, tail=["gloo"])])
    assert (cause.worker, cause.klass, [each.worker for each in cascade]) == (1, "collective", [0])
    assert line(cause, cascade, [2], None) == ("worker 1 failed first: in the collective (NCCL watchdog timeout); "
                                               "worker 0 then failed in the collective; worker 2 was stopped")
