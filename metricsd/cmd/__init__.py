"""Every process and command of ``metricsd``: the one place where components are wired together.

``main`` is the entry point and parser; each module is one subcommand (``up``, ``query``, ``agent``,
``store``, ``proxy``, ``configserver``, ``cluster``, ``status``, ``chaos``, ``consumers``,
``daysim``); ``runner`` runs a service's coroutine and turns start-up errors into one line.
Defaults (ports, intervals) live in metricsd/defaults.py.
"""
