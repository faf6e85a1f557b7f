"""Scheduler-level TTFT: one cached-suffix request alone vs one cold 200-token request alone.

Usage: python sprobe.py [model]   (default: small)
"""

import sys
import threading

import numpy as np

from g4bench.engine.engine import EngineConfig
from g4bench.engine.loading import load_engine
from g4bench.engine.scheduler import GenerationParams, Scheduler

engine, _ = load_engine(
    sys.argv[1] if len(sys.argv) > 1 else "small", EngineConfig(max_slots=8, max_len=4096)
)
scheduler = Scheduler(engine).start()


class Sink:
    """Collects one request's result; the probe waits on `done`."""

    def __init__(self):
        self.done = threading.Event()
        self.result = None

    def on_token(self, token, logprob=None):
        return False

    def on_finish(self, result):
        self.result = result
        self.done.set()


def run(prompt, max_tokens=16):
    sink = Sink()
    scheduler.submit(prompt, GenerationParams(max_tokens=max_tokens, ignore_eos=True), sink)
    sink.done.wait()
    return sink.result


rng = np.random.default_rng(0)
system_prompt = list(rng.integers(10, 100, 2000))
print("lead", run(system_prompt + list(rng.integers(10, 100, 200))).ttft_s)
for _ in range(6):
    cached = run(system_prompt + list(rng.integers(10, 100, 200)))
    cold = run(list(rng.integers(10, 100, 200)))
    print(
        f"cached {cached.cached_tokens} ttft {cached.ttft_s * 1e3:.0f} ms; cold ttft {cold.ttft_s * 1e3:.0f} ms"
    )
scheduler.stop()
