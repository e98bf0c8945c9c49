"""The operator console, a surface over the client like the CLI: ``python -m loopwarden.console``.

Its process imports this package before the rest of the tree, so it sets the garbage collector's thresholds here
(shared/gc_policy.py says why).
"""

from shared import gc_policy

gc_policy.set_thresholds()
