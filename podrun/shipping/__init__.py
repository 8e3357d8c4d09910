"""shipping."""
