"""The record of one trial, filled in by measure: its type and schema migrations, sample statistics,
repeats, the atomic writer, and the index of valid results by key that the loops resume from."""
