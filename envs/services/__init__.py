"""Services: long-lived things an env talks to, apart from the envs that use them.

* :mod:`~agentgym.envs.services.sandbox`: the code sandboxes (docker, bwrap, subprocess), their warm
  runners, the one per-process (and per-node, under Ray) selection that envs ask for;
* :mod:`~agentgym.envs.services.retrieval`: retrievers (dense, BM25, prebuilt Search-R1 indexes, a remote
  server), the retrieval server, and the per-process sharing that envs ask for.

A service holds state that outlives an episode (processes, an index in memory, a server) and is shared
by every env that needs it. Envs import services, never the reverse: nothing here imports an env
(``tests/test_layers.py`` reads the imports).
"""
