"""`probe check`'s machinery: run.py selects the cases and runs them (run_check),
pool.py and worker.py keep each backend in a worker process, calls.py makes a
backend's calls on one case in this process (also --repro's and pytest's), and
single.py checks and times one shape (`probe run`)."""
