"""The judge: the layered verdict on a backend's call.

verdict.py judges one output: written after the call returned, NaN / Inf, poison and
guards, inputs written, the floating-point environment and the caller's state, then
error against tolerance. watched.py gives unwritten output a moment more for a late
write. The layers that make more calls follow: repeat.py makes a passing call again
(leaks, a changed answer, threads at work; the measurements in probes.py), and
fresh_inputs.py runs a failing one on fresh copies of its inputs."""
