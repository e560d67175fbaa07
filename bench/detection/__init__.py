"""The detection benchmark's parts (``bench/bench_detection.py`` runs them).

- ``suite``: the synthetic fleet (tests, runs, points, what was injected where, the true levels and noise);
- ``trainguard_path``: the issue's config at several false-alert rates, the wire-format lines, one replay
  through the real pipeline, its alerts and stored bounds read back;
- ``anchors``: the reference detectors on the run-level values (median ± k·MAD, mean ± k·σ, change points);
- ``scoring``: one scorer for every detector's alerts, and the markdown table;
- ``harness``: each (seed, noise) suite evaluated for every detector, pooled per noise family.

Every function that makes or scores data is pure: the same spec gives the same numbers.
"""
