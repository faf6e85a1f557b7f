"""`g4bench roofline`: the decode step read against the device's measured streaming bandwidth.

`main` plans the run; `probes` are the measuring children (fresh processes); `report` prints them.
"""
