"""`g4bench revalidate`: the decode-step grid in interleaved fresh-process rounds, judged with CIs.

`main` builds the points and settings from the sweep file and flags; `sweep` runs the rounds
(`rounds`: the order; `visits`: which points one child measures); `records` and `verdicts` turn the
visits into per-point records and within-run comparisons (`compare`: ratio, CI and verdict word;
`visit_noise`: the host's pooled visit-to-visit noise).
"""
