"""Step-time profiles: `steptime` is the model form, `engine_steps` measures the engine's own calls,
`main` (`g4bench calibrate`) fits a profile from measured runs and validates it.
"""
