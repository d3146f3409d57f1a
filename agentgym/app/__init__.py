"""The application on top of the kernel: the ``agentgym`` command line (:mod:`~agentgym.app.cli`), the
HTML trajectory report (:mod:`~agentgym.app.report`), ``agentgym eval``'s config (:mod:`~agentgym.app.eval_run`; the
evaluation itself is the kernel's :mod:`agentgym.evaluation`) and
env checks (:mod:`~agentgym.app.checking`).

Run directories (:mod:`agentgym.runs`) and confidence intervals (:mod:`agentgym.stats`) live in the
kernel, not here: the trainer, the comparison harness and SFT need them too, and no part imports the
application.

The kernel (``agentgym/*.py``) never imports this package; this package imports the kernel and wires
concrete parts together, lazily.
"""
