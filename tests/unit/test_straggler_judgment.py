"""The straggler judged from samples of every worker's stacks (launch/stragglers.py), on texts in
remote/stacks.py's form. The real thing (torch, gloo, py-spy): tests/local/test_stragglers.py."""

from __future__ import annotations

from podrun.launch import odd_ones, stragglers

ALL_REDUCE = ["all_reduce (torch/distributed/distributed_c10d.py:3252)", "wrapper (torch/distributed/c10d_logger.py:81)",
              "<module> (train.py:12)"]
COMPUTE = ["compute (train.py:7)", "<module> (train.py:11)"]


def dump(frames: list[str], pid: int = 100) -> str:
    return (f"=== pid {pid} (parent 1): python3 train.py ===\nThread 0x7F01 (active): \"MainThread\"\n"
            + "".join(f"    {frame}\n" for frame in frames))


def sample(computing: set[int], workers: int = 4) -> list[odd_ones.Process]:
    """One sample's compared processes, from every worker's dump."""
    texts = {worker: dump(COMPUTE if worker in computing else ALL_REDUCE) for worker in range(workers)}
    return odd_ones.compared_processes(texts)


def test_a_worker_computing_while_the_others_wait_in_the_collective_held_them_back():
    assert stragglers.holding_back(sample({2})) == {
        2: ("in compute (train.py:7)", "in all_reduce (torch/distributed/distributed_c10d.py:3252)")}


def test_no_one_held_the_others_back_when_all_compute_or_all_wait_or_half_compute():
    assert stragglers.holding_back(sample(set())) == {}
    assert stragglers.holding_back(sample({0, 1, 2, 3})) == {}
    assert stragglers.holding_back(sample({0, 1})) == {}


def test_the_same_worker_in_three_samples_and_nearly_every_one_that_shows_any_is_the_straggler():
    held = [stragglers.holding_back(sample(computing)) for computing in ({1}, set(), {1}, set(), {1})]
    found = stragglers.straggler(held)
    assert found is not None and (found["worker"], found["held"], found["samples"]) == (1, 3, 5)
    assert found["said"] == ("w1 held the others back in 3 of the last 5 samples (in compute (train.py:7); the others "
                             "in all_reduce (torch/distributed/distributed_c10d.py:3252))")


def test_workers_taking_turns_name_no_straggler():
    held = [stragglers.holding_back(sample({worker})) for worker in (0, 1, 2, 3, 0, 1, 2, 3)]
    assert stragglers.straggler(held) is None
    assert stragglers.straggler([stragglers.holding_back(sample({1}))] * 2) is None  # two samples are too few
