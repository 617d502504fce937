"""Small helpers shared by the registry, the rules (``ops``) and the cost formulas (``costs``).

They live here, below all three, so none of those packages imports another to reach them
(``tests/test_import_graph.py``).
"""
