"""g4bench: what serving Gemma 4 E-series models with a pure-JAX engine on one chip really costs."""

__version__ = "0.1.0"
