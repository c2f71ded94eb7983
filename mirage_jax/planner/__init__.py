"""The planner: what each region of a traced function becomes, and why.

``region.plan_region`` runs the search for the region's backend (``search``), compiles,
verifies against XLA and times the winner, and keeps it only when it is verified and faster;
``search.split_for_search`` first splits regions too large for one search; ``whole`` then
times the plan as a whole and drops custom calls that do not pay there; ``decisions`` caches those verdicts on disk; ``library`` loads precompiled kernel libraries
whose decisions take precedence over both.
"""
