"""Helpers shared by the test tiers (on the path: pytest's pythonpath is tests/)."""
