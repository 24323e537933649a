"""One trial measured: runner (prepare -> measure -> commit), launcher, worker, timing, statistics."""
