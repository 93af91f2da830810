"""Native helpers compiled at install time (``make install`` runs
``python -m megacpp_core.native.build``): :mod:`megacpp_core.native.tswalk`, the tree walk
of stage 6 enrichment. Every caller has a pure-Python path with the same output."""
