"""Training the fusion head (``mmserve train-fusion``): pairs, frozen tower features, the loop.

Nothing on the serving path imports this package (an import-linter contract keeps it so).
"""
