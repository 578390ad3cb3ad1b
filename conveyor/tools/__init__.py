"""The ``conveyor`` command and what it runs, above the graphs: nothing below imports it.

``cli`` is the command (``conveyor.tools.cli:main``, also ``python -m conveyor``); each
subcommand's module adds its own parser: ``run``, ``show`` (validate, show), ``check``,
``bench_commands`` (bench, tune), ``reference`` (ops; also docs/ops.md). What they run:
``measure`` (driving a loader, its counters, item sizes), ``bottleneck`` (the limiting node),
``tables`` (the per-node table), ``bench``, ``tune``, ``report`` and ``plots`` (the HTML report
and its SVG charts), ``trace`` (Chrome traces) and ``batch_info`` (a batch's structure).
"""
