"""Side-by-side benchmarks of flopscope against other FLOP counters.

One command regenerates ``docs/benchmarks.md`` and its plots::

    .venv/bin/python -m benchmarks.run

See ``benchmarks/run.py`` for the options (sections, quick mode, reuse of cached results).
"""
