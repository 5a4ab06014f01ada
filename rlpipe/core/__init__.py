"""Records, the run configuration and the error tree. Imports nothing internal."""
