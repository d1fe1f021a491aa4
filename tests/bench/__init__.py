"""`make bench`: the pipeline's figures and their ratios to the raw broker,
measured in one run on this machine (see docs/performance.md).

Not collected by pytest (no `test_` modules here): figures are printed,
never asserted, except the outcome — lost or duplicated effects are a FAIL.
"""
