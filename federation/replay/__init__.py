"""Trace replay: the real placer on a simulated federation, against the policies users would run.

`config` holds every assumption, `trace` and `prices` read the inputs, `world` builds the federation
a policy runs on, `sim` is the discrete-event simulator that calls `placement.plan`, `metrics`
summarises what happened and `report` writes tables and plots. `sweep` runs policies x sizes.
"""
