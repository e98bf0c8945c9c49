"""The worker services, one package each, run as ``python -m services.<name>``.

Every service's process imports this package first, so it sets the garbage collector's thresholds here, before
the service imports the rest of the tree (shared/gc_policy.py says why).
"""

from shared import gc_policy

gc_policy.set_thresholds()
