"""The planner: what each region of a traced function becomes, and why.

``region.plan_region`` runs the search for the region's backend (``search``), compiles,
verifies against XLA and times the winner, and keeps it only when it is verified and faster;
``decisions`` caches those verdicts on disk; ``library`` loads precompiled kernel libraries
whose decisions take precedence over both.
"""
