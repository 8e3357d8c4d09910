"""What keeps the launcher's cost flat per worker at 1,024 workers (docs/benchmarks.md, Pod scale):
counted, not timed."""

from __future__ import annotations

import asyncio

from podrun.transport import local
from podrun.transport.local import LocalTransport


def test_local_workers_are_spawned_a_few_per_turn_of_the_event_loop(tmp_path, monkeypatch):
    # 1,024 workers' starts all ready at once spawned every process in one turn of the loop (12-15 s on
    # a loaded machine), and agents waiting for a heartbeat gave up; now each turn spawns a few
    spawned = 0
    spawn = asyncio.create_subprocess_exec

    async def counted_spawn(*args, **kwargs):
        nonlocal spawned
        spawned += 1
        return await spawn(*args, **kwargs)

    monkeypatch.setattr(local.asyncio, "create_subprocess_exec", counted_spawn)

    async def main() -> list[int]:
        transports = [LocalTransport(str(tmp_path / f"w{index}")) for index in range(48)]
        for transport in transports:
            await transport.connect()
        per_turn: list[int] = []

        async def count_turns() -> None:
            seen = 0
            while True:
                await asyncio.sleep(0)  # once per turn of the loop
                per_turn.append(spawned - seen)
                seen = spawned

        counting = asyncio.ensure_future(count_turns())
        await asyncio.sleep(0)
        channels = await asyncio.gather(*(transport.start("exit 3") for transport in transports))
        counting.cancel()
        assert [await channel.wait() for channel in channels] == [3] * 48
        return per_turn

    per_turn = asyncio.run(main())
    assert sum(per_turn) == 48
    assert max(per_turn) <= local.SPAWNS_AT_ONCE, per_turn
