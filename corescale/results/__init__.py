"""Results: files written atomically, the store (one table), compare, cost."""
