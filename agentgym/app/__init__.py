"""The application on top of the kernel: the ``agentgym`` command line (:mod:`~agentgym.app.cli`), the
HTML trajectory report (:mod:`~agentgym.app.report`), run directories (:mod:`~agentgym.app.runs`),
evaluation (:mod:`~agentgym.app.evaluation`), confidence intervals (:mod:`~agentgym.app.stats`) and env
checks (:mod:`~agentgym.app.checking`).

The kernel (``agentgym/*.py``) never imports this package; this package imports the kernel and wires
concrete parts together, lazily.
"""
