"""A TCP proxy that adds a fixed delay to every request: each chunk a client sends waits
`delay_s` before it goes on (a request is one chunk, so each costs a round trip more), the
replies come back at once. It counts the requests and the bytes sent back.

    with LatencyProxy(9000, 0.020) as proxy:  # 127.0.0.1:proxy.port reaches port 9000
        ...
"""

from __future__ import annotations

import asyncio
import threading


class LatencyProxy:
    def __init__(self, target_port: int, delay_s: float, host: str = "127.0.0.1") -> None:
        self.target = (host, target_port)
        self.delay_s = delay_s
        self.requests = 0
        self.bytes_back = 0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="latency-proxy")

    def __enter__(self) -> LatencyProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _serve(self, reader, writer) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return

        async def up() -> None:
            while data := await reader.read(65536):
                self.requests += 1
                await asyncio.sleep(self.delay_s)
                up_writer.write(data)
                await up_writer.drain()
            up_writer.close()

        async def down() -> None:
            while data := await up_reader.read(1 << 20):
                self.bytes_back += len(data)
                writer.write(data)
                await writer.drain()
            writer.close()

        await asyncio.gather(up(), down(), return_exceptions=True)
