"""Scheduler-level TTFT: one cached-suffix request alone vs one cold 200-token alone (small)."""
import statistics, sys, threading, time
import numpy as np
from g4bench.engine.engine import EngineConfig
from g4bench.engine.loading import load_engine
from g4bench.engine.scheduler import Scheduler, GenerationParams
engine,_=load_engine(sys.argv[1] if len(sys.argv)>1 else 'small', EngineConfig(max_slots=8, max_len=4096))
sch=Scheduler(engine).start()
class Sink:
    def __init__(s): s.ev=threading.Event(); s.res=None
    def on_token(s,t,lp=None): return False
    def on_finish(s,r): s.res=r; s.ev.set()
def run(prompt, n=16):
    k=Sink(); sch.submit(prompt, GenerationParams(max_tokens=n, ignore_eos=True), k); k.ev.wait(); return k.res
rng=np.random.default_rng(0)
sysp=list(rng.integers(10,100,2000))
print('lead', run(sysp+list(rng.integers(10,100,200))).ttft_s)
for r in range(6):
    a=run(sysp+list(rng.integers(10,100,200))); b=run(list(rng.integers(10,100,200)))
    print(f"cached {a.cached_tokens} ttft {a.ttft_s*1e3:.0f} ms; cold ttft {b.ttft_s*1e3:.0f} ms")
sch.stop()
