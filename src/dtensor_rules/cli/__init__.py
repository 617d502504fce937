"""The package's face: the command line (``main``), the demo, the coverage table.

Nothing in the product imports this package; it imports the product.
"""
