"""Operational scripts (``run_dataflow.sh``'s helpers, the demo publisher)."""
