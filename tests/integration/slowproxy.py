"""A :class:`FaultProxy` that trickles response bodies: ``piece`` bytes, then a pause.

Downloads through it take long enough that an interrupt or a kill lands while bytes
are still arriving (the window the cache must survive), whatever the machine's speed.
"""

from __future__ import annotations

import socket
import time

from support.faultproxy import FaultProxy, RequestRecord

__all__ = ["SlowProxy"]


class SlowProxy(FaultProxy):
    """Forwards response bodies ``piece`` bytes at a time, ``pause_s`` apart."""

    def __init__(
        self,
        upstream: tuple[str, int],
        base_options: dict[str, object] | None = None,
        piece: int = 16 * 1024,
        pause_s: float = 0.004,
    ) -> None:
        super().__init__(upstream, base_options=base_options)
        self.piece = piece
        self.pause_s = pause_s

    def _send(self, client: socket.socket, data: bytes, record: RequestRecord, body: bool) -> None:
        if not body:
            super()._send(client, data, record, body)
            return
        for at in range(0, len(data), self.piece):
            super()._send(client, data[at : at + self.piece], record, body)
            time.sleep(self.pause_s)
