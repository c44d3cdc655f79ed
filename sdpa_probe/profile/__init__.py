"""`probe profile`: a transformer decode step built from the native building blocks,
timed op by op in native code (see docs/profile.md).

models       shape presets and validation
settings     what a run is asked to do, from the command's options; the --context grammar
attention    which graph runs in the attention slot (decomposed, fused, a kernel, user)
builds       native builds with other compiler flags, user kernels, machine metadata
decode       the native model / state / step wrapper
measure      timed steps with graphs interleaved, token rates, the logits check
graph        per-op bytes moved and FLOPs from the shapes
stats        medians, IQR, bootstrap confidence intervals
summaries    per-op and per-kind numbers, the A/B verdict, growth over a sweep
run          one whole run: plan, checks, measurement, the result document (run_profile)
provenance   the machine and build lines shown with every table, chart and trace
chart        a context sweep as text and as SVG
report       Rich tables, JSON, CSV and Chrome trace output
interactive  the --interactive prompt loop
"""
