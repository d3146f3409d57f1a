"""The maths (installed as ``agentgym.algorithms.maths``): pure functions and small modules on tensors.

:mod:`.returns` (returns-to-go, baselines, ReBN, GAE, group normalisation), :mod:`.advantages` (each
advantage estimator one registered function), :mod:`.objectives` (each policy loss one registered
function), :mod:`.losses` (the shared terms: log-probs, surrogates, KL, value loss, aggregation) and
:mod:`.critic` (the value model). It imports the kernel and :mod:`agentgym.algorithms.parts` only;
nothing from :mod:`agentgym.algorithms.loop` or :mod:`agentgym.algorithms.compare`
(tests/test_layers.py reads the imports). The public names are stated in :mod:`agentgym.algorithms`.
"""
