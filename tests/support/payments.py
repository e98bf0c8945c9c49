"""Reading the demo payment provider's statement: how many charges a run made.

The demo payment tools (``charge_card``, the ``transfer_funds`` test tool) record one
``charge.<run>.<id>`` key per side effect in the ``lw_demo`` bucket. The count comes from the
server (the bucket's subjects under a filter): listing keys client-side can come back short
while the connection is busy, which would hide a doubled charge or invent a lost one.
"""

from __future__ import annotations

from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from shared import subjects as S


async def count_charges(js: JetStreamContext, run_id: str) -> int:
    try:
        info = await js.stream_info(f"KV_{S.KV_DEMO}", subjects_filter=f"$KV.{S.KV_DEMO}.charge.{run_id}.>")
    except NotFoundError:  # no payment tool has run yet: no bucket, no charges
        return 0
    return len(info.state.subjects or {})
