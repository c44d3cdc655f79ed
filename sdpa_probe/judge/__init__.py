"""Layers of the verdict that make more calls than the one judged."""
