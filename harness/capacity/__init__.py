"""`g4bench capacity`: how many sequences fit, on the local device or compiled for a TPU target.

`main` turns settings into a run folder and one `search` (bracket, then bisect) per configuration;
`probes` measures or compiles one batch (`aot`: the deviceless compile and what XLA says);
`latency` prices each ceiling; `admission` answers agents × context; `report` prints and plots.
"""
