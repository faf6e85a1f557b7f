"""Prefill of a 200-token suffix after 2,000 cached vs the same 200 tokens cold, with one-pass
prefill attention (block None) and key-blocked (256) — two engines on the same params, interleaved."""
import statistics, sys, time
import jax
from g4bench.engine.engine import Engine, EngineConfig
from g4bench.engine.loading import load_engine
model=sys.argv[1]; reps=int(sys.argv[2]) if len(sys.argv)>2 else 5
ecfg=EngineConfig(max_slots=8, max_len=4096)
blocked,_=load_engine(model, ecfg)
onepass=Engine(blocked.cfg, blocked.params, ecfg, prefill_attention_block=None)
prefix, suffix = list(range(10,2010)), list(range(3000,3200))
def timed(e, slot, toks, start):
    t0=time.perf_counter(); e.prefill(slot,toks,start); jax.block_until_ready(e.cache); return time.perf_counter()-t0
for e in (blocked, onepass):
    for off in range(0,2000,256): e.prefill(1, prefix[off:off+256], off)
    timed(e,0,suffix,0); timed(e,1,suffix,2000)
res={}
for _ in range(reps):
    for name,e in (("blocked",blocked),("one-pass",onepass)):
        res.setdefault((name,"cold"),[]).append(timed(e,0,suffix,0))
        res.setdefault((name,"cached"),[]).append(timed(e,1,suffix,2000))
for name in ("one-pass","blocked"):
    c=statistics.median(res[(name,"cold")]); w=statistics.median(res[(name,"cached")])
    print(f"{model} {name}: 200 tokens cold {c*1e3:.1f} ms, after 2,000 cached {w*1e3:.1f} ms, ratio {w/c:.2f} (n={reps}; {jax.devices()[0].platform}, block {blocked.prefill_attention_block if name=='blocked' else None})")
