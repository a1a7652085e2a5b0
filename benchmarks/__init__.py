"""``trl-padfree bench``: padded vs padding-free training, one harness for every trainer (docs/benchmark.md).

:mod:`.cli` (the command line), :mod:`.workloads` (the tasks, their data and variants, as data), :mod:`.harness` (a
worker process per variant, one memory meter, the report) and :mod:`.flops` (the one FLOP model). The benchmark is
this directory of a source checkout, not part of the installed package.
"""
