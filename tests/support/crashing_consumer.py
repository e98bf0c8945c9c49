"""A consumer whose handler kills its own process on every delivery (python -m ...).

``LW_CRASH_SUBJECT`` names the subject; each delivery that reaches the handler appends a
line to ``LW_CRASH_LOG`` and exits the process with code 3, as a segfaulting or OOM-killed
handler would. The bus must dead-letter the message once it has been delivered more than
``LW_MAX_DELIVER`` times, before running the handler again.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from shared import subjects as S
from shared.bus import Bus
from shared.messages import RunAdvance
from shared.settings import load_settings


async def main() -> None:
    subject = os.environ["LW_CRASH_SUBJECT"]
    bus = Bus(load_settings("crashtest"), "crashtest")

    @bus.consumer(
        durable="crashtest_" + S.token(subject.rsplit(".", 1)[-1]), filter_subjects=[subject], model=RunAdvance
    )
    async def on_event(ev: RunAdvance) -> None:
        fd = os.open(os.environ["LW_CRASH_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, f"{ev.run_id}\n".encode())
        os.close(fd)
        os._exit(3)

    await bus.start()
    print("crashtest ready", flush=True)
    stop: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    await stop


if __name__ == "__main__":
    asyncio.run(main())
