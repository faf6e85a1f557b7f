"""`python -m tests.server.fake_server [--step-delay S] [--max-body-bytes N] [--idle-timeout S]
[--stall] [--engine-stall S]`: the fake engine behind the same uvicorn setup `g4bench serve` uses
(transport.make_server, StopOnEngineFailure), on 127.0.0.1 port 0, in its own process. Prints
`PORT <n>` on stdout once listening; stops on SIGTERM/SIGINT like `serve`, and exits 3 when the
engine watchdog trips (`--stall`: every decode blocks for ever). Process-level tests (idle connections, SIGTERM, event-loop stalls)
need a server whose GIL they do not share.
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading

from g4bench.engine.scheduler import Scheduler
from g4bench.server.app import create_app
from g4bench.server.settings import ServerSettings
from g4bench.server.synthetic_tokenizer import SyntheticTokenizer
from g4bench.server.transport import StopOnEngineFailure, make_server
from tests.server.fake_engine import FakeEngine


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--step-delay", type=float, default=0.0)
    ap.add_argument("--max-body-bytes", type=int, default=ServerSettings().max_body_bytes)
    ap.add_argument("--idle-timeout", type=float, default=10.0)
    ap.add_argument("--shutdown-timeout", type=float, default=2.0)
    ap.add_argument("--stall", action="store_true")
    ap.add_argument("--engine-stall", type=float, default=ServerSettings().engine_stall_s)
    args = ap.parse_args()
    engine = FakeEngine(max_slots=4, max_len=8192, step_delay_s=args.step_delay)
    if args.stall:
        engine.decode_gate = threading.Event()  # never set: the first decode never returns
    scheduler = Scheduler(engine)
    stop = StopOnEngineFailure()
    settings = ServerSettings(
        max_body_bytes=args.max_body_bytes, engine_stall_s=args.engine_stall, on_engine_failure=stop
    )
    app = create_app(scheduler, SyntheticTokenizer(512), "fake", settings)
    server = make_server(
        app, head_timeout_s=args.idle_timeout, graceful_shutdown_s=args.shutdown_timeout, log_level="warning"
    )
    stop.server = server
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    scheduler.start()
    try:
        server.run(sockets=[sock])
    finally:
        scheduler.stop(timeout=args.shutdown_timeout)
        sock.close()
    sys.exit(3 if stop.reason is not None else 0)


if __name__ == "__main__":
    main()
