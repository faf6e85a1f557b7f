"""The measuring layer: the engine's public API in, run folders of typed records out.

A small measurement core at the top level, shared by every command:

- `run` (run folders), `records` / `results` (typed records, the schema, reading runs back),
  `env` (where a record was measured), `hardware` (device figures), `isolate` (fresh-process
  children), `timing` (step timing), `hostload` (is the host quiet), `stats`, `tables`, `plots`,
  `args` (the list and target values every command line parses, the CLI's and the rooms' own).

One room per capability, each over that core (a room's `main` is its command's entry point):

- `revalidate/`: the decode-step grid in interleaved fresh-process rounds, judged with CIs.
- `capacity/`: residency ceilings on the local device or compiled for a TPU target, with latency.
- `roofline/`: the decode step against the device's measured streaming bandwidth.
- `calibrate/`: step-time profiles: the model form, the engine-steps measurements, fitting.
- `load/`: serve-load against a live server (workloads, client, SLO, reports, constraint cost).
- `sim/`: the discrete-event simulator, `plan` and its validation against serve-load.
- `checks/`: gate, verify, parity against transformers, doctor.

Rooms import the core and each other's public functions; nothing here imports the CLI, and the
engine knows nothing of this layer (tests/test_layers.py).
"""
