"""`probe fuzz`: cases drawn by hypothesis from the whole parameter space (space.py), run
in check's workers (live_pool.py) and judged as check judges them, a failure shrunk and
named by its kind (runner.py, kinds.py) and kept in a corpus (corpus.py); the factor
pairs a set of cases meets (coverage.py); threaded cases under varied scheduling
(stress.py)."""
