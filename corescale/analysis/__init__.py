"""What is read back from a results root: the results table (store), compare, cost."""
