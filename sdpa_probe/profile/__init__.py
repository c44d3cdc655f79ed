"""`probe profile`: a transformer decode step built from the native building blocks,
timed op by op in native code (see docs/profile.md).

models   shape presets and validation
decode   the native model / state / step wrapper
graph    per-op bytes moved and FLOPs from the shapes
runner   measurement: steps, A/B interleaving, context sweeps, pp/tg
stats    medians, IQR, bootstrap confidence intervals
report   Rich tables, JSON, CSV and Chrome trace output
"""
