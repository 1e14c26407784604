"""Local cluster management: a Ray head for Ray Client use (``soul cluster up|down|status``, :mod:`.local_cluster`),
the command line's local runtime (one head per data dir, :mod:`.local_runtime`) and what a head listens on
(:mod:`.listening_ports`)."""
