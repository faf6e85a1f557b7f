"""Checks that answer yes or no: `gate` (a run against its baseline), `verify` and `parity`
(our engine against transformers and compressed-tensors), `doctor` (can this machine run g4bench).
"""
