"""The applications of soul-runtime: the ``soul`` command (:mod:`soul_apps.cli`), its benchmarks
(:mod:`soul_apps.bench`), the HTTP service and local cluster management. They stand on the Ray layer (``actors``)
and the core (``soul_runtime``) and import downward only; nothing below imports them (docs/architecture.md,
"Packages as bands"; checked by tests/test_layout.py)."""
