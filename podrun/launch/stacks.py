"""Every worker's Python stacks, now (remote/stacks.py on each): on a stall, and for `podrun stacks`.

They are saved in the job's directory on the launcher as `stacks/<n>/wN.txt`, one folder per dump, and
summed up as where the workers' processes differ (odd_ones.py).
"""

from __future__ import annotations

import asyncio
import os

from podrun import jobstore
from podrun.launch import odd_ones
from podrun.transport.base import ChannelLost, Transport

COLLECT_TIMEOUT_S = 60  # remote/stacks.py gives each py-spy 20 s; a worker that says nothing by then is named


async def collect(workers: list[tuple[int, Transport, str]]) -> dict[int, str]:
    """Each worker's stacks text (or why there is none), from connected transports, all at once: (index,
    transport, the job's directory on it) each."""
    async def one(index: int, transport: Transport, job_dir: str) -> str:
        try:
            channel = await transport.start_python("stacks", unlisted=[job_dir])
            output, errors, _ = await asyncio.wait_for(
                asyncio.gather(channel.stdout.read(), channel.stderr.read(), channel.wait()), COLLECT_TIMEOUT_S)
        except ChannelLost as lost:
            return f"no stacks: worker {index} lost its connection ({lost})\n"
        except asyncio.TimeoutError:
            return f"no stacks: worker {index} gave none within {COLLECT_TIMEOUT_S}s\n"
        return output.decode(errors="replace") + errors.decode(errors="replace")

    texts = await asyncio.gather(*(one(*worker) for worker in workers))
    return dict(zip((index for index, _, _ in workers), texts))


def save(record: jobstore.JobRecord, texts: dict[int, str]) -> str:
    """Write one dump as `stacks/<n>/wN.txt`; returns its folder."""
    folder = record.new_stacks_dir()
    for index, text in texts.items():
        with open(os.open(os.path.join(folder, f"w{index}.txt"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
                  "w") as handle:
            handle.write(text)
    return folder


def saved_and_summed_up(record: jobstore.JobRecord, texts: dict[int, str]) -> list[str]:
    """Save one dump of every worker's stacks (a stall's); the lines to say: where the workers' processes
    differ, and where the dump is."""
    folder = save(record, texts)
    return [*odd_ones.summary(texts), f"stacks of every worker saved in {folder}"]


def newest_saved(record: jobstore.JobRecord) -> tuple[str, dict[int, str]] | None:
    """The newest dump saved for the job (its folder, and each worker's text), or None."""
    root = os.path.join(record.dir, jobstore.STACKS_DIR)
    numbers = [int(entry) for entry in os.listdir(root) if entry.isdigit()] if os.path.isdir(root) else []
    if not numbers:
        return None
    folder = os.path.join(root, str(max(numbers)))
    texts = {}
    for name in os.listdir(folder):
        if name.startswith("w") and name.endswith(".txt") and name[1:-4].isdigit():
            with open(os.path.join(folder, name), errors="replace") as handle:
                texts[int(name[1:-4])] = handle.read()
    return folder, texts
